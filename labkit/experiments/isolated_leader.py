"""A leader cut off by a network partition keeps acknowledging: a split brain, and its cost.

    run = experiments.run("isolated-leader", acks="1")  # on a partitionable failure lab
    run = experiments.run("isolated-leader", cluster=lab, acks="1",  # with 03c's loop and
                          pipeline=write_payments, settings=producer_settings)  # settings
        run.lost_acknowledged                           # acknowledged, then truncated away

The experiment, on real brokers whose links to each other go through cuttable forwarders
(``labkit.faults.partition``); no broker is killed or frozen. Its parts: a topic on brokers
1-3; the client, a produce loop whose delivery reports are kept (``AcknowledgingProducer``:
the notebook's loop and settings, or the reference ones; it also notes the broker the
producer was sending to at each acknowledgement), handed the records by an order of things
that reports ``copied`` and ``viewed``; the nemesis, broker 1 isolated on ``copied`` and the
network healed on ``viewed`` (``labkit.faults.broker_faults``); the checker, the
acknowledged writes against the log (``labkit.checking.checks.AcknowledgedWrites``). In
order:

1. A topic with one partition on brokers 1, 2 and 3 (broker 1 leads), with the run's
   ``min.insync.replicas``; the first half of the records is written and copied to all 3.
2. Broker 1 is isolated: its link to the controller and the link its followers fetch
   through are cut. Clients still reach it. The controller stops hearing its heartbeats,
   fences it and elects broker 2 or 3; broker 1, hearing nothing, still thinks it leads.
3. The same producer, whose metadata still names broker 1, is handed the second half, one
   record at a time over ``SPLIT_WRITE_S``. With acks=1 broker 1 acknowledges each one on
   its own; with acks=all it waits for followers that never fetch, and the records time out
   (measured: once the producer has found the new leader, after those timeouts, the records
   still waiting go there and are acknowledged by it).
4. Both sides are asked during the split: broker 1 about itself, broker 2 (the controller's
   view) about the partition, with leader epochs and each one's log end offset.
5. The network heals; broker 1 learns it was replaced, follows the new leader and
   truncates its log to it.
6. The audit reads the partition back: an id the loop's delivery callback noted as
   acknowledged and that is not there is ``lost_acknowledged``. With acks=1 that is every
   record written during the split (the design fixes it: ``records - records // 2``, all
   acknowledged by broker 1); with acks=all and min.insync.replicas=2, none. A record that
   timed out is not known to be missing: the new leader may have written it. And
   librdkafka's idempotence holds within one producer epoch only: a record timing out in
   flight starts a new one, and the records resent after it can be written twice (seen
   once: 7 duplicates).

Which broker acknowledged a record: the broker the producer was sending the partition to
(librdkafka's statistics, every 100 ms) when the loop noted its acknowledgement
(``labkit.experiments.acknowledged``); a producer sends a partition's records only to the
leader it knows.
"""
from __future__ import annotations

import time
from collections import Counter

from labkit import progress
from labkit.checking.checks import AcknowledgedWrites
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.acknowledged import AcknowledgingProducer, check_loop, halves
from labkit.experiments.failover import replica_state
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import FAILURE_LAB, REQUIRED, Experiment, Option, register
from labkit.faults.broker_faults import Heal, Isolate, WholeLab
from labkit.faults.nemesis import Nemesis, on
from labkit.kafka.inspect import Inspector
from labkit.kafka.localcluster import LocalCluster
from labkit.pipelines import data
from labkit.pipelines.delivery_reports import write_payments
from labkit.progress import wait_until

SCENARIO = "isolated-leader"
ACKS = ("1", "all")
LEADER, OTHERS = 1, (2, 3)
SPLIT_WRITE_S = 3.0  # the second half is written over this long, one record at a time
# A record not acknowledged by then is reported failed: short, so a run with acks=all
# (whose records written during the split are never acknowledged) ends in seconds.
DELIVERY_TIMEOUT_MS = 6000
# The controller fences a silent broker after broker.session.timeout.ms (4 s in a failure
# lab); on a loaded machine, generous. The rejoin after the heal takes a few seconds too.
ELECTION_WAIT_S = 60.0
REJOIN_WAIT_S = 60.0
STALL_S = 90.0  # longer than any bounded wait above
# What `labkit scenario isolated-leader --json` prints after "scenario", in this order.
RUN_KEYS = ("acks", "min_insync", "produced", "during_split", "acknowledged",
            "acknowledged_during_split", "acknowledged_by", "not_acknowledged", "in_log",
            "lost_acknowledged", "lost_acknowledged_by", "duplicated", "new_leader",
            "election_s", "old_leader_acknowledged_for_s", "old_leader_view",
            "controller_view", "rejoined_s", "old_leader_process")


def split(run, client: AcknowledgingProducer) -> None:
    """The client's order of things; the cut and the heal fire on the events it reports."""
    lab, topic = run.cluster, run.topics["output"]
    first, second = halves(run.inputs)
    states: list = []  # broker 1's process state at each step
    run.observe(old_leader_pid=lab.broker(LEADER).pid, old_leader_process=[])
    elected_at: list[float] = []
    with run.status("Isolated leader"):

        def step(what: str) -> None:
            states.append(lab.process_states()[LEADER])
            run.observe(old_leader_process=list(states))
            run.step(what)

        def payments():
            yield from first
            # The loop asks for the next one: the producer sends the first half by itself.
            with Inspector(lab.broker(LEADER).address, timeout_s=5) as inspector:
                wait_until(lambda: inspector.offsets(topic)[0].high_watermark >= len(first),
                           "the followers to copy the first records", 30)
            step(f"{len(first)} records written, copied to all 3")
            run.event("copied")  # broker 1 is cut off from the controller and its followers
            cut = time.monotonic()
            elected = _wait_for_new_leader(lab, topic)
            elected_at.append(time.monotonic())
            run.observe(new_leader=elected.leader, election_s=round(elected_at[0] - cut, 1))
            step(f"the controller fenced broker 1 and elected broker {elected.leader} "
                 f"(epoch {elected.leader_epoch})")
            start = time.monotonic()
            for i, record in enumerate(second):  # one at a time, over SPLIT_WRITE_S
                time.sleep(max(0.0, start + SPLIT_WRITE_S * i / len(second) - time.monotonic()))
                yield record
            time.sleep(max(0.0, start + SPLIT_WRITE_S - time.monotonic()))
            step(f"{len(second)} more written during the split")

        client.write(payments())  # returns once the loop has its answers (flush)
        during = {r["id"] for r in second} & set(client.acked)
        step(f"{len(during)} of them acknowledged")
        run.observe(old_leader_view=_view(lab, topic, LEADER),
                    controller_view=_view(lab, topic, OTHERS[0]))
        step(f"broker 1 says: {run.facts['old_leader_view']['text']}")
        step(f"broker 2 says: {run.facts['controller_view']['text']}")
        run.event("viewed")  # the network heals
        healed = time.monotonic()
        _wait_for_rejoin(lab, topic, run.facts["new_leader"])
        run.observe(rejoined_s=round(time.monotonic() - healed, 1))
        step(f"broker 1 follows broker {run.facts['new_leader']} and has cut its log back to it")
    old_acks = [client.acked_at[i] for i in during if client.acked[i] == LEADER]
    run.observe(during_split=len(second), acknowledged_during_split=len(during),
                acknowledged_by=dict(Counter(str(client.acked[i]) for i in during)),
                old_leader_acknowledged_for_s=round(max(old_acks) - elected_at[0], 1)
                if old_acks else None)


def _summary(run) -> str:
    kept = ("" if run.old_leader_acknowledged_for_s is None else
            f"; the old leader acknowledged for {run.old_leader_acknowledged_for_s:.1f} s "
            "after the controller had replaced it")
    return (f"acks={run.options['acks']} min.insync.replicas={run.options['min_insync']}, "
            f"broker 1 isolated: produced={run.produced} acknowledged={run.acknowledged} "
            f"in_log={run.in_log} lost_acknowledged={run.lost_acknowledged} "
            f"duplicated={run.duplicated}\n"
            f"    during the split: {run.acknowledged_during_split} of "
            f"{run.during_split} acknowledged (by leader: {run.acknowledged_by or 'none'})"
            f"; not acknowledged: {run.not_acknowledged or 'none'}{kept}\n"
            f"    broker 1 said: {run.old_leader_view.get('text')}\n"
            f"    broker 2 said: {run.controller_view.get('text')}")


def _view(lab: LocalCluster, topic: str, at: int) -> dict:
    """The partition as broker ``at`` sees it, and how far its own log goes."""
    state = replica_state(lab, topic, at)
    address = lab.broker(at).address
    with Inspector(address, timeout_s=5) as inspector:
        end = inspector.log_end_offset(topic, address)
    return {"broker": at, "leader": state.leader, "leader_epoch": state.leader_epoch,
            "isr": list(state.isr), "log_end_offset": end,
            "text": f"{state.text()}, leader epoch {state.leader_epoch}, its log ends at {end}"}


def _wait_for_new_leader(lab: LocalCluster, topic: str):
    """The partition once the controller has replaced broker 1, as broker 2 sees it."""
    found = []

    def decided() -> bool:
        state = replica_state(lab, topic, OTHERS[0])
        if state.leader not in (None, LEADER):
            found.append(state)
        return bool(found)

    wait_until(decided, "the controller to fence broker 1 and elect another leader",
               ELECTION_WAIT_S)
    return found[0]


def _wait_for_rejoin(lab: LocalCluster, topic: str, leader: int) -> None:
    """Until broker 1 knows the new leader, is back in its ISR and its log ends where the
    new leader's does (what it had alone is truncated)."""
    def rejoined() -> bool:
        progress.beat("broker 1 to rejoin")
        view = _view(lab, topic, LEADER)
        return (view["leader"] == leader and LEADER in view["isr"]
                and view["log_end_offset"] == _view(lab, topic, leader)["log_end_offset"])

    wait_until(rejoined, "broker 1 to follow the new leader and truncate its log",
               REJOIN_WAIT_S)


def producer_settings(bootstrap: str, acks: str) -> dict:
    """The producer under test, as notebook 03c shows it: its settings for ``acks``."""
    return {"bootstrap.servers": bootstrap, "acks": acks,
            "enable.idempotence": acks == "all",  # idempotence requires acks=all
            "linger.ms": 5, "message.timeout.ms": DELIVERY_TIMEOUT_MS}


register(Experiment(
    SCENARIO, "the partition's leader cut off by a network partition keeps "
    "acknowledging while the controller elects another: what acks=1 loses when it heals",
    pipeline="the produce loop (as write_payments(producer, topic, payments, acknowledged, "
             "failed))", check_pipeline=check_loop,
    where=FAILURE_LAB, stall_after=STALL_S, partitions=True, options=(
        Option("acks", REQUIRED, "the producer's acks", ACKS),
        Option("min_insync", 1, "the topic's min.insync.replicas", ("1", "2"), kind=int),
        common.records(40, "records (half during the split)", minimum=4,
                why="half before the split, half during"),
        Option("settings", None, "the producer's settings (as producer_settings(bootstrap, "
               "acks))", kind=object, cli=False),
    ),
    workload=lambda o: Workload("isolated", (Topic(
        "output", replica_assignment=[[LEADER, *OTHERS]],
        config={"min.insync.replicas": str(o.min_insync)}),), data.generate(o.records, prefix="i")),
    clients=lambda run: AcknowledgingProducer(split, acks=run.o.acks, track_broker=True,
                                              settings=run.o.settings or producer_settings,
                                              loop=run.pipeline or write_payments),
    nemesis=lambda o: Nemesis(WholeLab(), Isolate(LEADER, on("copied")), Heal(on("viewed"))),
    checkers=lambda o: [AcknowledgedWrites(
        SCENARIO, f"acks={o.acks}",
        fault="leader partitioned from the controller and followers",
        # asked of the new leader
        read_from=lambda run: run.cluster.broker(run.facts["new_leader"]).address)],
    presentation=Presentation(summary=_summary, json=lambda run: {
        "scenario": SCENARIO, **{k: run.facts[k] if k in run.facts else run.options[k]
                                 for k in RUN_KEYS}}),
    text=lambda run: f"{run.summary()}\n{run.timeline()}"))
