"""The judge: a consume-transform-produce loop run as production runs it, and audited.

    run = experiments.run("judge", phase="point", crash_at="mid-batch", pipeline=my_loop)
    run = experiments.run("judge", phase="schedule", seed=3, pipeline=my_loop)
    run.verdict, run.findings, run.faults, run.errors

The loop (the learner's function, or the lab's reference ``production_loop.fee_service``)
runs as ``instances`` members of one consumer group over ``partitions`` partitions, as
supervised processes: a killed one is started again, one that exits with an error too (what
it raised is kept: ``errors``), one that stops before its input is consumed too. It runs
until its input is consumed and its output quiet (``labkit.experiments.app_run``), then the
output is audited as downstream reads it (``isolation``).

- ``phase="point"``: each instance SIGKILLed at a named crash point of its code (its
  first visit; ``crashed`` lists the points that fired), the input written once the group
  has formed;
  ``fault`` adds a network fault (a lost ack, an abortable error on the wire).
- ``phase="schedule"``: the input arrives while the group works, and a seeded schedule of
  production's faults lands on it, one every 1.5-3 s: SIGKILLs, a member joining and one
  leaving (rebalances), an instance frozen until the group moved its partitions on and
  then woken (a zombie: its late writes and offsets must be fenced), an abortable error on
  a Produce and on a TxnOffsetCommit (the transaction must be aborted and its batch read
  again; its records stay in the log as aborted ones, so the reader's isolation is judged),
  and a successor with an instance's transactional.id (a fatal error: the fenced one must
  stop).

Besides the audit's counts, the findings name what production would see: a transaction
left open (``hanging-transaction``: read_committed readers wait for it), an instance that
went on after it was fenced (``fenced-ran-on``). Each fault that fired is on the run's
timeline, so a finding can be set beside what happened just before it.
"""
from __future__ import annotations

import random
import re
import time

from confluent_kafka import Producer

from labkit.checking.checkers import Result
from labkit.checking.checks import TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments.app_run import AppClients
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import Experiment, Option, register
from labkit.faults.crashpoints import named, per_instance
from labkit.faults.nemesis import Nemesis
from labkit.faults.process_faults import (CrashAt, Freeze, Join, Kill, Leave, Replace,
                                          any_running)
from labkit.faults.schedule import Schedule
from labkit.faults.wire_faults import Arm, ProxyFault
from labkit.kafka import topics
from labkit.kafka.clientlog import client_config
from labkit.kafka.inspect import InspectError, Inspector
from labkit.pipelines import data, learner, production_loop
from labkit.pipelines.group import GROUP_PROTOCOLS
from labkit.kafka.topics import ISOLATION_LEVELS

NAME = "judge"
# Each phase is one kind of production's faults (the fast feedback: the first one that
# breaks a loop names it), "schedule" all of them at once, seeded.
PHASES = {
    "point": "each instance SIGKILLed at a named crash point of its code",
    "wire": "a produce acknowledgement lost, then a record refused (an abortable error)",
    "kills": "SIGKILLs at random moments",
    "rebalance": "a member joins the group, then one leaves",
    "zombie": "an instance frozen until the group moved its partitions on, then woken",
    "offsets": "the offsets sent to a transaction refused, as a fenced member's are",
    "fenced": "a successor starts with an instance's transactional.id",
    "schedule": "all of these, shuffled and spaced by a seed",
}
BETWEEN_S = (1.5, 3.0)  # between two faults of the schedule
FEED_S = 12.0  # the schedule's input arrives over this long; a single kind's over FEED_S / 2
FROZEN_AT_MOST_S = 60.0  # a zombie is woken once the group moved on, or after this long
# What the lab gives the loop, each setting only if the function asks for it by name.
SETTINGS = ("bootstrap", "input_topic", "output_topic", "group_id", "transactional_id",
            "instance_id", "group_protocol", "batch_size")


def _members(run, count: int) -> list[dict]:
    return [_member(run, i) for i in range(count)]


def _member(run, i: int) -> dict:
    """Instance ``i``'s settings: its own static member id and transactional.id."""
    settings = {"input_topic": run.topics["input"], "output_topic": run.topics["output"],
                "group_id": run.group_id, "transactional_id": run.transactional_id(i),
                "instance_id": f"{run.base}-{i}", "group_protocol": run.o.group_protocol,
                "batch_size": 10}
    # the learner's function (or the lab's), sent as the text of its cell, called with the
    # settings it names
    loop = run.pipeline or production_loop.fee_service
    learner.check_parameters(loop, set(SETTINGS))
    return {**settings, "code": learner.code_of(loop), "function": loop.__name__}


def _clients(run) -> AppClients:
    o = run.o
    return AppClients(None, lambda: {"bootstrap": run.client_bootstrap}, worker=learner.run_code,
                      members=_members(run, o.instances), timeout_s=o.timeout,
                      stall_s=o.stall_s, label=f"judge [{o.phase}]", feed=_feed,
                      restart_exited=True, on_done=_close_hanging, own_crashes=25)


GROUP_FORMED_S = 30.0  # the input waits this long at most for every instance to join


def _feed(run) -> None:
    """The input, once every instance has joined the group (so each has partitions, and
    each crash point armed is reached): at once for a point, a slice at a time over FEED_S
    for the schedule (the group works while the faults land, as a service does)."""
    deadline = time.monotonic() + GROUP_FORMED_S
    while time.monotonic() < deadline:
        members = run.progress.members()
        if members is not None and len(members) >= run.o.instances:
            break
        time.sleep(0.2)
    producer = Producer(client_config({"bootstrap.servers": run.bootstrap,
                                       "enable.idempotence": True, "linger.ms": 5}))
    slices = 1 if run.o.phase == "point" else 40
    feed_s = FEED_S if run.o.phase == "schedule" else FEED_S / 2
    step = max(1, len(run.inputs) // slices)
    for start in range(0, len(run.inputs), step):
        for r in run.inputs[start:start + step]:
            producer.produce(run.topics["input"], key=str(r["key"]).encode(),
                             value=topics.encode(r))
        producer.flush(30)
        if slices > 1:
            time.sleep(feed_s / slices)
    if producer.flush(30):
        raise RuntimeError("the judge could not write its own input")


def _moved_on(run, instance: int) -> bool:
    """Has the group moved on without the frozen instance? Its static member id is gone
    from the group (asked at most once a second)."""
    now = time.monotonic()
    if now < getattr(run, "_asked_at", 0.0) + 1.0:
        return False
    run._asked_at = now
    members = run.progress.members()
    static_id = run.workers.instances[instance].kwargs.get("instance_id")
    return members is not None and static_id not in {m[1] for m in members}


def production_faults(phase: str, seed: int) -> list:
    """The faults of ``phase`` (all of them for "schedule"), before the schedule's shuffle."""
    rng = random.Random(seed)
    pick = lambda: any_running(rng.randrange(1 << 30))  # noqa: E731 - a choice per fault
    kinds = {
        "wire": [Arm("drop-ack:produce:1", name="a produce acknowledgement lost"),
                 Arm("error:produce:1:INVALID_RECORD",
                     name="an abortable error on a Produce (a record refused)")],
        "kills": [Kill(pick()), Kill(pick())],
        "rebalance": [Join(settings=lambda run, i: _member(run, i)), Leave(pick())],
        "zombie": [Freeze(pick(), for_s=FROZEN_AT_MOST_S, until=_moved_on)],
        "offsets": [Arm("error:txnoffsetcommit:1:ILLEGAL_GENERATION",
                        name="the offsets sent to the transaction refused")],
        "fenced": [Replace(pick())]}
    if phase == "schedule":
        return [fault for faults in kinds.values() for fault in faults]
    return kinds[phase]


def _nemesis(o) -> Nemesis:
    if o.phase == "point":
        # one point per instance (their first visit): every instance has partitions, the
        # input written once the group has formed
        faults = [CrashAt(point, hit=1, instance=i) for i, point in enumerate(points(o.crash_at))]
        return Nemesis(*faults, *([ProxyFault(o.fault)] if o.fault else []))
    # each fault a seeded delay after the loop's first commit since the last one (or since
    # a restart): it lands while the loop works, not while it starts
    return Nemesis(ProxyFault(), Schedule(
        production_faults(o.phase, o.seed), BETWEEN_S, seed=o.seed, clock="commit",
        offsets_committed=lambda run: run.progress.sample(fresh=True)[0], name=PHASES[o.phase]))


def points(crash_at: str | list | tuple | None) -> list[str]:
    """The crash points of a point run: one, or one per instance ("a,b" or a list)."""
    return named(crash_at)


def _check(phase, crash_at, instances, **_) -> None:
    armed = per_instance(crash_at, instances)
    if armed and phase != "point":
        raise ValueError(f"crash_at is for phase point; phase {phase} has faults of its own")


def behaviour(run) -> list[Result]:
    """What production would see besides the data: a transaction left open (every
    read_committed reader of its partitions waits for it until its transaction.timeout.ms),
    an instance that went on after it was fenced (a fatal error taken for another). The
    audit's verdict stays the data's; a judge fails a loop on these too."""
    hanging = run.facts.get("hanging", [])
    # A successor fenced in its turn: the instance it replaced came back with their
    # transactional.id instead of stopping (a fatal error taken for one to recover from).
    successors = {f.successor for s in run.nemesis.of(Schedule) for f in s.done
                  if isinstance(f, Replace)}
    ran_on = sorted({f["instance"] for f in run.clients.pool.result.failures
                     if f["instance"] in successors and "FENCED" in raised(f["log"])})
    return [r for r in (Result("hanging-transaction", not hanging, len(hanging), hanging),
                        Result("fenced-ran-on", not ran_on, len(ran_on), ran_on))
            if not r.valid]


def _checkers(o) -> list:
    crash_at = ",".join(points(o.crash_at)) or None
    return [TopicAudit(NAME, "exactly_once", crash_at, o.fault or
                       (PHASES[o.phase] if o.phase != "point" else None),
                       isolation=o.isolation)]


ERROR = re.compile(r"KafkaError\{code=(\w+),val=-?\d+,str=\"([^\"]*)\"(.*?)\}")


def raised(log: str) -> str:
    """What a worker raised, from its log's last lines: Kafka's error and its class."""
    found = ERROR.findall(log)
    if found:
        code, text, flags = found[-1]
        kind = ("fatal" if "fatal=True" in flags else "abortable" if
                "txn_requires_abort=True" in flags else "retriable" if "retriable=True" in flags
                else "not retriable")
        return f"{code} ({kind}): {text}"
    lines = [line.strip(" |") for line in log.splitlines() if line.strip(" |")]
    return lines[-1] if lines else "(nothing in its log)"


def _facts(run) -> dict:
    app: AppClients = run.clients
    failures = app.pool.result.failures
    return {"errors": [{"instance": f["instance"], "attempt": f["attempt"],
                        "raised": raised(f["log"])} for f in failures],
            "faults_fired": [f.what for f in run.fired_faults],
            "waited": app.waited, "stalls": app.stalls, "notes": app.notes,
            "restarts": app.pool.result.attempts - len(app.pool.instances),
            "seconds": app.seconds, "fault_stats": run.facts.get("fault_stats"),
            "crashed": app.pool.result.crashed_at,
            "findings": {r.name: r.examples for r in behaviour(run)}}


def _close_hanging(run) -> None:
    """Once the input is consumed and the output quiet, no transaction of a right loop is
    open. One still open was left by an instance that died and was never fenced: every
    read_committed reader waits for it until its transaction.timeout.ms. It is a finding;
    then it is aborted as an operator would (a producer with its transactional.id), so the
    audit counts what the loop really delivered."""
    try:
        with Inspector(run.bootstrap, timeout_s=10) as inspector:
            hanging = sorted(t.transactional_id
                             for t in inspector.transactions(topic=run.topics["output"]))
    except (InspectError, OSError):
        hanging = []
    run.facts["hanging"] = hanging
    for transactional_id in hanging:
        producer = Producer(client_config({"bootstrap.servers": run.bootstrap,
                                           "transactional.id": transactional_id}))
        producer.init_transactions(30)  # fences it and aborts what it left open
        run.step(f"judge: aborted the transaction {transactional_id} left open")


def _summary(run) -> str:
    lines = [run.report.summary()]
    lines += [f"  {name}: {', '.join(map(str, examples))}" for name, examples in
              run.findings.items()]
    lines += [f"  fault: {what}" for what in run.faults_fired]
    lines += [f"  instance {e['instance']} raised {e['raised']}" for e in run.errors]
    lines += [f"  slow, not stalled: {w}" for w in run.waited]
    return "\n".join(lines)


register(Experiment(
    NAME, "a consume-transform-produce loop as production runs it: a group of instances, "
    "crashes, rebalances, a zombie, abortable and fatal errors", stall_s=600.0,
    pipeline="the loop (as labkit.pipelines.production_loop.fee_service)", options=(
        Option("phase", "point", " | ".join(f"{k}: {v}" for k, v in PHASES.items()),
               tuple(PHASES)),
        Option("crash_at", None, "phase point: the crash point, or one per instance "
               "(a,b: instance 0 at a, instance 1 at b)"),
        Option("fault", None, "phase point: a network fault too, e.g. drop-ack:produce:1"),
        Option("instances", 2, "instances of the loop in one group", kind=int, minimum=1),
        Option("partitions", 3, "partitions of the input and the output", kind=int, minimum=1),
        Option("records", 300, "input records", kind=int, short="-n", minimum=1),
        Option("seed", 0, "the input's seed and the schedule's", kind=int),
        Option("group_protocol", "classic", "classic | consumer (KIP-848)", GROUP_PROTOCOLS),
        Option("isolation", "read_committed", "how downstream reads the output",
               tuple(ISOLATION_LEVELS)),
        Option("timeout", 240.0, "seconds for the whole run", kind=float),
        Option("stall_s", 30.0, "seconds without progress (its group not waiting) that make "
               "an instance stalled", kind=float),
        Option("keep_topics", False, "keep the run's topics", kind=bool)),
    workload=lambda o: Workload(f"judge-{o.phase}", (
        Topic("input", o.partitions), Topic("output", o.partitions)),
        data.generate(o.records, seed=o.seed, keys=data.keys_for(o.partitions))),
    check=_check, clients=_clients, nemesis=_nemesis, checkers=_checkers, facts=_facts,
    presentation=Presentation(summary=_summary, json_facts=(
        "findings", "errors", "faults_fired", "waited", "restarts", "seconds"))))
