"""The judge: a consume-transform-produce loop run as production runs it, and audited.

    run = experiments.run("judge", phase="point", crash_at="mid-batch", pipeline=my_loop)
    run = experiments.run("judge", phase="schedule", seed=3, pipeline=my_loop)
    run.verdict, run.findings, run.faults_fired, run.errors, run.waited

The loop (the learner's function, or the lab's reference ``production_loop.fee_service``;
any function of plain confluent-kafka that takes the settings it names; or a Java loop,
``labkit.pipelines.java_loop``, each instance a JVM: ``judge_java``) runs as
``instances`` members of one consumer group over ``partitions`` partitions, as supervised
processes: a killed one is started again, one that exits with an error too (what it raised
is kept with Kafka's class of it: ``errors``), one that stops before its input is consumed
too. The input (``labkit.experiments.feed``) holds records of an upstream's aborted
transactions too. The run is done once the input is consumed and the output quiet
(``labkit.experiments.app_run``: a group that waits for a dead member's session is slow, not
stalled, whatever the loop's settings); then the output is audited as downstream reads it
(``isolation``).

- ``phase="point"``: each instance SIGKILLed at a named crash point of its code (its first
  visit; ``crashed`` lists the points that fired), the input written once the group has
  formed; ``fault`` adds network faults (``a+b``: a lost ack, an abortable error on the
  wire, ``kill:endtxn:1``: a crash as the first commit is sent).
- one phase per kind of production's fault (``labkit.faults.production``): ``kills``,
  ``wire``, ``rebalance``, ``zombie``, ``offsets``, ``fenced``; ``schedule`` all of them,
  shuffled by the seed. The input arrives while the group works; each fault lands a seeded
  1-2 s after the loop's next commit.

Besides the audit's counts, the findings name what production would see
(``labkit.experiments.judge_findings``): a transaction left open, an instance that went on
after it was fenced, one that died of an abortable error, committed offsets that stop short
of the input's end, an aborted input record processed. Each fault that fired is on the
run's timeline, so a finding can be set beside what happened just before it.
"""
from __future__ import annotations

import time

from confluent_kafka import KafkaException, Producer

from labkit.checking import history
from labkit.checking.checks import TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments import judge_findings as findings
from labkit.experiments import judge_java
from labkit.experiments.app_run import AppClients
from labkit.experiments.feed import feed
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import Experiment, Option, register
from labkit.faults.crashpoints import named, per_instance
from labkit.faults.nemesis import Nemesis
from labkit.faults.process_faults import CrashAt
from labkit.faults.production import BETWEEN_S, KINDS, SCHEDULE, production_faults
from labkit.faults.schedule import Schedule
from labkit.faults.wire_faults import ProxyFault
from labkit.kafka.clientlog import client_config
from labkit.kafka.inspect import InspectError, Inspector
from labkit.pipelines import data, learner, production_loop
from labkit.pipelines.group import GROUP_PROTOCOLS
from labkit.kafka.topics import ISOLATION_LEVELS

NAME = "judge"
# Each phase is one kind of production's faults (the fast feedback: the first one that
# breaks a loop names it), "schedule" all of them at once, seeded.
PHASES = {"point": "each instance SIGKILLed at a named crash point of its code", **KINDS,
          "schedule": SCHEDULE,
          # on a failure lab of three brokers: experiments.run("judge-coordinator")
          "coordinator": "the broker coordinating the loop's transactions SIGKILLed"}
FEED_S = 12.0  # the schedule's input arrives over this long; a single kind's over FEED_S / 2
# ... but a rebalance's over FEED_S too: a member joins seconds after it is started (a
# process, then the group's join); with the input over by then a loop's transaction is
# mostly empty when partitions move (a loop that ignores the revoke passed 2 runs of 8 with
# faults 1.5-3 s apart; docs/measurements.md, "Stop 47")
FEED_LONGER = ("schedule", "rebalance")
IDLE_S = 10.0  # input all there, faults landed, nothing moving this long: idle (or stalled)
# A transaction open this long once the run is done hangs: no instance is ending it (a dead
# one holds it until transaction.timeout.ms); a live one ends its own within a batch's time.
HANG_GRACE_S = 10.0
# ... counted from the latest start of an instance given its transactional.id: that
# instance's init_transactions() ends it, and on a loaded machine a start takes seconds (ten
# learners' verdicts on two cores called a right loop's restart "hanging"); at most this long
HANG_AT_MOST_S = 60.0
# Exits by themselves the loop may have before it is judged broken. Under KIP-848 a static
# member restarted after a SIGKILL is refused, fatally (UNRELEASED_INSTANCE_ID), until its
# predecessor's session ends (6 s on the lab broker): each restart in that window is one,
# and two instances killed one after the other made 25 (the capstone's solution, once in
# a fresh clone's suite). A supervisor restarts it; so does the judge.
OWN_CRASHES = 60
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
    if judge_java.loop_of(run) is not None:  # a Java loop: these are its environment
        return settings
    # the learner's function (or the lab's), sent as the text of its cell, called with the
    # settings it names
    loop = run.pipeline or production_loop.fee_service
    learner.check_parameters(loop, set(SETTINGS))
    return {**settings, "code": learner.code_of(loop), "function": loop.__name__}


def _clients(run) -> AppClients:
    o = run.o  # the judge's options, or the coordinator phase's (no crash point, no fault)
    java = judge_java.loop_of(run)
    command, env, worker = (None, lambda: {"bootstrap": run.client_bootstrap}, learner.run_code) \
        if java is None else (judge_java.command(run, java), lambda: judge_java.shared_env(run), None)
    return AppClients(command, env, worker=worker,
                      members=_members(run, o.instances), timeout_s=o.timeout,
                      stall_s=o.stall_s, label=f"judge [{o.phase}]", feed=_feed,
                      restart_exited=True, on_done=_close_hanging, own_crashes=OWN_CRASHES,
                      idle_s=IDLE_S, audit_stalled=True)


def _feed(run) -> None:
    o = run.o
    feed(run, all_at_once=o.phase == "point", over_s=FEED_S if o.phase in FEED_LONGER
         else FEED_S / 2, aborted=o.aborted_input, instances=o.instances)


def points(crash_at: str | list | tuple | None) -> list[str]:
    """The crash points of a point run: one, or one per instance ("a,b" or a list)."""
    return named(crash_at)


def _check(phase, crash_at, instances, **_) -> None:
    armed = per_instance(crash_at, instances)
    if armed and phase != "point":
        raise ValueError(f"crash_at is for phase point; phase {phase} has faults of its own")


def _nemesis(o) -> Nemesis:
    # the proxy's trace of the transactional APIs and Produce: how each instance reacted
    proxy = ProxyFault(o.fault, to_history=True, trace_apis=findings.LEDGER_APIS) \
        if o.fault or o.phase != "point" else None
    if o.phase == "point":
        # one point per instance (their first visit): every instance has partitions, the
        # input written once the group has formed
        faults = [CrashAt(point, hit=1, instance=i) for i, point in enumerate(points(o.crash_at))]
        return Nemesis(*faults, *([proxy] if proxy else []))
    # each fault a seeded delay after the loop's first commit since the last one (or since
    # a restart): it lands while the loop works, not while it starts
    return Nemesis(proxy, Schedule(
        production_faults(o.phase, o.seed, member=_member), BETWEEN_S, seed=o.seed,
        clock="commit", offsets_committed=lambda run: run.progress.sample(fresh=True)[0],
        name=PHASES[o.phase]))


def _checkers(o) -> list:
    crash_at = ",".join(points(getattr(o, "crash_at", None))) or None
    return [TopicAudit(NAME, "exactly_once", crash_at, getattr(o, "fault", None) or
                       (PHASES[o.phase] if o.phase != "point" else None),
                       isolation=o.isolation, restart_reads=True),
            findings.aborted_input_read(o.isolation)]


def _errors(events: list[dict]) -> list[dict]:
    """What each instance that exited with an error raised, and its class."""
    found = []
    for e in findings.raised(events):
        kind = ("fatal" if e.get("fatal") else "abortable" if e.get("abortable") else
                "retriable" if e.get("retriable") else "not retriable") if "code" in e else ""
        what = f"{e['code']} ({kind})" if kind else e["error"]
        found.append({"instance": int(e["instance"]), "attempt": e["attempt"],
                      "raised": f"{what}: {e['text']}", "class": kind or None})
    return found


def _facts(run) -> dict:
    app: AppClients = run.clients
    events = findings.events(run)  # the history, read once for both
    return {"errors": _errors(events),
            "faults_fired": [f.what for f in run.fired_faults],
            "waited": app.waited, "stalls": app.stalls, "notes": app.notes,
            "restarts": app.pool.result.attempts - len(app.pool.instances),
            "seconds": app.seconds, "fault_stats": run.facts.get("fault_stats"),
            "crashed": app.pool.result.crashed_at,
            **findings.history_facts(events)}


def _close_hanging(run) -> str | None:
    """Once the input is consumed and the output quiet (or nothing moves), no transaction of
    a right loop is open. One still open was left by an instance that died and was never
    fenced: every read_committed reader waits for it until its transaction.timeout.ms, and
    so does a successor that must read the offsets it sent (KIP-447's stable offsets). It
    is a finding, unless no loop could have ended it (``_stranded``); then it is aborted as
    an operator would (a producer with its transactional.id), as its timeout would: what
    waited for it goes on (the runner lets it), and the audit counts what the loop
    delivered, never a wait as a loss."""
    hanging = _open_transactions(run)
    began = time.monotonic()
    # open throughout, not at one instant, for those an instance may still end (alive, a
    # zombie; or to be started again: its init_transactions() aborts it); one that no
    # instance holds any more (it left, it was replaced; a loop's fresh id) waits for nothing
    while (waiting := [t for t in hanging if _may_end(run, t)]) and time.monotonic() < min(
            began + HANG_AT_MOST_S,
            max(began + HANG_GRACE_S, *(_started(run, t) + HANG_GRACE_S for t in waiting))):
        time.sleep(0.5)
        hanging = {t: s for t, s in _open_transactions(run).items() if t in hanging}
    stranded = _stranded(run, hanging)
    # what the findings read (``hanging-transaction``): the history, not this run's state
    history.append(run.history_file, "open-transactions", hanging=sorted(set(hanging) - stranded),
                   stranded=sorted(stranded))
    for transactional_id in sorted(hanging):
        producer = Producer(client_config({"bootstrap.servers": run.bootstrap,
                                           "transactional.id": transactional_id}))
        _init(producer)  # fences it and aborts what it left open
        run.step(f"judge: aborted the transaction {transactional_id} left open")
    if not hanging:
        return None
    if stranded == set(hanging):
        return (f"the transaction {', '.join(sorted(stranded))} of an instance the judge "
                "stopped before its code could end it (aborted, as its transaction.timeout.ms "
                "would)")
    return (f"the transaction {', '.join(sorted(hanging))} left open by a dead instance "
            "(aborted, as its transaction.timeout.ms would)")


def _stranded(run, open_since: dict[str, int | None]) -> set[str]:
    """The open transactions no loop could have ended: begun before the latest start of an
    instance given their transactional.id, and none of those instances runs now. That
    instance's first transactional call (``init_transactions``) aborts what its
    predecessor left open: it was stopped before its code got there (a member leaving,
    SIGTERMed while it still started on a loaded machine: the capstone's solution under
    load), as a scale-down can do in production. Its readers wait out the transaction's
    timeout: a wait, not the loop's finding. (A loop that takes a fresh transactional.id
    at each start is not given the id it left open: never stranded.)"""
    pool = run.clients.pool
    last_start: dict[str, float] = {}
    for entry in history.read(run.history_file):
        if entry.get("kind") == "started":
            last_start[entry["instance"]] = max(entry["t"], last_start.get(entry["instance"], 0.0))
    stranded = set()
    for transactional_id, since_ms in open_since.items():
        ids = _given(pool, transactional_id)
        if since_ms is None or not ids or any(pool.running(i) for i in ids):
            continue
        if since_ms / 1000 < max(last_start.get(str(i), 0.0) for i in ids):
            stranded.add(transactional_id)
    return stranded


def _may_end(run, transactional_id: str) -> bool:
    """Whether an instance given ``transactional_id`` runs, or is still supervised (started
    again if it died): its next transactional call ends what the id left open."""
    pool = run.clients.pool
    return any(pool.running(i) or not (pool.instances[i].gone or pool.instances[i].finished)
               for i in _given(pool, transactional_id))


def _started(run, transactional_id: str) -> float:
    """When the latest running instance given ``transactional_id`` started (0: none runs)."""
    pool = run.clients.pool
    return max([pool.started_at(i) or 0.0 for i in _given(pool, transactional_id)] or [0.0])


def _given(pool, transactional_id: str) -> list[int]:
    """The instances whose settings give them ``transactional_id``."""
    return [i for i, instance in enumerate(pool.instances)
            if instance.kwargs.get("transactional_id") == transactional_id]


def _init(producer: Producer, within_s: float = 60.0) -> None:
    """``init_transactions``, called again on an error that is not fatal: on a loaded
    machine the coordinator may still be ending the transaction (CONCURRENT_TRANSACTIONS,
    seen with ten learners' verdicts on two cores)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return producer.init_transactions(30)
        except KafkaException as exc:
            if exc.args[0].fatal():
                return  # a newer producer took the id: its own init aborted what was open
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _open_transactions(run) -> dict[str, int | None]:
    """The transactional ids with a transaction open on the output now, each with when the
    broker says it began (epoch ms, None if it does not say)."""
    try:
        with Inspector(run.bootstrap, timeout_s=10) as inspector:
            return {t.transactional_id: t.start_time_ms
                    for t in inspector.transactions(topic=run.topics["output"])}
    except (InspectError, OSError):
        return {}


def _summary(run) -> str:
    lines = [run.report.summary()]
    lines += [f"  {name}: {', '.join(map(str, examples))}" for name, examples in
              run.findings.items()]
    lines += [f"  fault: {what}" for what in run.faults_fired]
    lines += [f"  instance {e['instance']} raised {e['raised']}" for e in run.errors]
    lines += [f"  slow, not stalled: {w}" for w in run.waited]
    return "\n".join(lines)


# The options of every run of the loop, the judge's and the coordinator's (judge_coordinator).
COMMON = (
        Option("instances", 2, "instances of the loop in one group", kind=int, minimum=1),
        Option("partitions", 6, "partitions of the input and the output (several for each "
               "instance: a batch spans partitions)", kind=int, minimum=1),
        common.records(300),
        Option("aborted_input", 20, "input records written in aborted transactions, as an "
               "upstream's (a loop must never process them)", kind=int, minimum=0),
        common.seed("the input and the schedule"),
        Option("group_protocol", "classic", "classic | consumer (KIP-848)", GROUP_PROTOCOLS),
        Option("isolation", "read_committed", "how downstream reads the output",
               tuple(ISOLATION_LEVELS)),
        common.timeout(240.0),
        common.stall_s(30.0),
        common.keep_topics(False),
        Option("keep_workdir", False, "keep the run's directory (each instance's log, the "
               "history)", kind=bool, cli=False))
PARTS = dict(
    pipeline="the loop (as labkit.pipelines.production_loop.fee_service)",
    workload=lambda o: Workload(f"judge-{o.phase}", (
        Topic("input", o.partitions), Topic("output", o.partitions)),
        data.generate(o.records, seed=o.seed, keys=data.keys_for(o.partitions))),
    clients=_clients, checkers=_checkers, facts=_facts, history_facts=findings.history_facts,
    presentation=Presentation(summary=_summary, json_facts=(
        "findings", "errors", "faults_fired", "waited", "restarts", "seconds")))

register(Experiment(
    NAME, "a consume-transform-produce loop as production runs it: a group of instances, "
    "crashes, rebalances, a zombie, abortable and fatal errors", stall_after=600.0, options=(
        Option("phase", "point", " | ".join(f"{k}: {v}" for k, v in PHASES.items()
                                            if k != "coordinator"),
               tuple(p for p in PHASES if p != "coordinator")),
        Option("crash_at", None, "phase point: the crash point, or one per instance "
               "(a,b: instance 0 at a, instance 1 at b)"),
        Option("fault", None, "phase point: a network fault too, e.g. drop-ack:produce:1"),
        *COMMON),
    check=_check, nemesis=_nemesis, **PARTS))
