"""A leader cut off by a network partition keeps acknowledging: a split brain, and its cost.

    run = experiments.run("isolated-leader", acks="1")  # on a partitionable failure lab
        run.lost_acknowledged                           # acknowledged, then truncated away

The experiment, on real brokers whose links to each other go through cuttable forwarders
(``labkit.faults.partition``); no broker is killed or frozen:

1. A topic with one partition on brokers 1, 2 and 3 (broker 1 leads), with the run's
   ``min.insync.replicas``; the first half of the records is written and copied to all 3.
2. Broker 1 is isolated: its link to the controller and the link its followers fetch
   through are cut. Clients still reach it. The controller stops hearing its heartbeats,
   fences it and elects broker 2 or 3; broker 1, hearing nothing, still thinks it leads.
3. The same producer, whose metadata still names broker 1, writes the second half, one
   record at a time over ``SPLIT_WRITE_S``. With acks=1 broker 1 acknowledges each one on
   its own; with acks=all it waits for followers that never fetch, and the records time out
   (measured: once the producer has found the new leader, after those timeouts, the records
   still waiting go there and are acknowledged by it).
4. Both sides are asked during the split: broker 1 about itself, broker 2 (the controller's
   view) about the partition, with leader epochs and each one's log end offset.
5. The network heals; broker 1 learns it was replaced, follows the new leader and
   truncates its log to it.
6. The audit reads the partition back: an id the producer was told was written and that is
   not there is ``lost_acknowledged``. With acks=1 that is every record written during the
   split (the design fixes it: ``records - records // 2``, all acknowledged by broker 1);
   with acks=all and min.insync.replicas=2, none. A record that timed out is not known to
   be missing: the new leader may have written it. And librdkafka's idempotence holds
   within one producer epoch only: a record timing out in flight starts a new one, and the
   records resent after it can be written twice (seen once: 7 duplicates).

``pipeline=`` is the producer's settings (a function of ``bootstrap`` and ``acks``, as
``producer_settings``): notebook 03c shows them as a cell, and the run makes its producer
from that cell.

Which broker acknowledged a record: the broker the producer was sending the partition to
(librdkafka's statistics, every 100 ms: the partition's ``broker``) at the first sample
after the acknowledgement arrived; a producer sends a partition's records only to that
broker. (The statistics' ``leader`` field lagged behind for seconds when the producer learnt
the new leader from a produce error, and the sample before the acknowledgement can predate
the move: both misnamed the broker in runs under load.)
"""
from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from labkit import progress
from labkit.experiments.failover import AcknowledgedRun, producer_from, replica_state
from labkit.experiments.registry import FAILURE_LAB, REQUIRED, Experiment, Option, register
from labkit.kafka import names, topics
from labkit.kafka.inspect import Inspector
from labkit.kafka.localcluster import LocalCluster
from labkit.pipelines import data
from labkit.progress import status, wait_until

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
NOT_PRINTED = ("old_leader_pid", "topic", "history", "steps")  # by --json


def producer_settings(bootstrap: str, acks: str) -> dict:
    """The producer under test, as notebook 03c shows it: its settings for ``acks``."""
    return {"bootstrap.servers": bootstrap, "acks": acks,
            "enable.idempotence": acks == "all",  # idempotence requires acks=all
            "linger.ms": 5, "message.timeout.ms": DELIVERY_TIMEOUT_MS}


@dataclass
class IsolatedLeaderRun(AcknowledgedRun):
    acks: str
    min_insync: int
    produced: int = 0
    during_split: int = 0  # records written while broker 1 was isolated
    acknowledged: int = 0
    acknowledged_during_split: int = 0
    acknowledged_by: dict[str, int] = field(default_factory=dict)  # leader -> records (split)
    not_acknowledged: dict[str, int] = field(default_factory=dict)  # error name -> records
    in_log: int = 0
    lost_acknowledged: int = 0
    lost_acknowledged_by: dict[str, int] = field(default_factory=dict)  # leader -> records
    duplicated: int = 0
    new_leader: int | None = None
    election_s: float | None = None  # from the cut to the controller's new leader
    # from the controller's election to the old leader's last acknowledgement
    old_leader_acknowledged_for_s: float | None = None
    old_leader_view: dict = field(default_factory=dict)  # broker 1 about the partition
    controller_view: dict = field(default_factory=dict)  # broker 2 (the controller's metadata)
    rejoined_s: float | None = None  # from the heal to broker 1 in sync with the new leader
    old_leader_process: list[str] = field(default_factory=list)  # as the OS saw it, per step
    old_leader_pid: int | None = None
    topic: str = ""
    history: list[dict] = field(default_factory=list, repr=False)
    steps: list[tuple[float, str]] = field(default_factory=list, repr=False)

    scenario, fault = "isolated-leader", "leader partitioned from the controller and followers"

    def to_json(self) -> str:
        """What ``labkit scenario isolated-leader --json`` prints: the counts and views."""
        fields = {k: v for k, v in asdict(self).items() if k not in NOT_PRINTED}
        return json.dumps({"scenario": self.scenario, **fields})

    def summary(self) -> str:
        kept = ("" if self.old_leader_acknowledged_for_s is None else
                f"; the old leader acknowledged for {self.old_leader_acknowledged_for_s:.1f} s "
                "after the controller had replaced it")
        return (f"acks={self.acks} min.insync.replicas={self.min_insync}, broker 1 isolated: "
                f"produced={self.produced} acknowledged={self.acknowledged} "
                f"in_log={self.in_log} lost_acknowledged={self.lost_acknowledged} "
                f"duplicated={self.duplicated}\n"
                f"    during the split: {self.acknowledged_during_split} of "
                f"{self.during_split} acknowledged (by leader: {self.acknowledged_by or 'none'})"
                f"; not acknowledged: {self.not_acknowledged or 'none'}{kept}\n"
                f"    broker 1 said: {self.old_leader_view.get('text')}\n"
                f"    broker 2 said: {self.controller_view.get('text')}")

    def timeline(self) -> str:
        return "\n".join(f"{t:5.1f} s  {what}" for t, what in self.steps)


def isolated_leader(lab: LocalCluster, acks: str = "1", min_insync: int = 1,
                    records: int = 40,
                    settings: Callable[..., dict] = producer_settings) -> IsolatedLeaderRun:
    """Isolate a partition's leader by a network partition and write to it through the split.
    ``settings``: the producer's (``producer_settings`` by default)."""
    check_settings(acks, min_insync, records)
    lab.heal()
    lab.restart()  # every broker up (a failed run may have left one down)
    topic = names.topic(f"isolated-{time.monotonic_ns() % 10**9}")
    run = IsolatedLeaderRun(acks, min_insync, topic=topic,
                            old_leader_pid=lab.broker(LEADER).pid)
    topics.create(lab.bootstrap, topic, replica_assignment=[[LEADER, *OTHERS]],
                  config={"min.insync.replicas": str(min_insync)})
    inputs = data.generate(records, prefix="i")
    first, second = inputs[:records // 2], inputs[records // 2:]
    # (when, broker): the broker the producer sends the partition to, from its statistics
    # ("broker", not "leader": a leader learnt from a produce error moves the partition
    # before the metadata's leader field follows, seen here for seconds)
    sending_to: list[tuple[float, int]] = []
    acked_at: dict[str, float] = {}  # id -> when its acknowledgement arrived
    refused: Counter[str] = Counter()

    def delivered(err, msg) -> None:
        rid = topics.decode(msg.value())["id"]
        if err is None:
            acked_at[rid] = time.monotonic()
        else:
            refused[err.name()] += 1

    def statistics(text: str) -> None:
        part = json.loads(text).get("topics", {}).get(topic, {}).get("partitions", {}).get("0")
        if part is not None and part["broker"] >= 0:  # -1: between two brokers
            sending_to.append((time.monotonic(), part["broker"]))

    def acknowledged_by(when: float) -> int | None:
        """The broker the producer sent to at the first statistics after an acknowledgement:
        a record goes to that broker only, and the answer comes back before it moves on."""
        return next((broker for t, broker in sending_to if t >= when), None)

    # the lab watches which broker the producer sends to (its statistics, every 100 ms); its
    # log lines here would be about the cut-off broker's timeouts
    producer = producer_from(settings, lab.bootstrap, acks, log_level=2,
                             stats_cb=statistics, **{"statistics.interval.ms": 100})
    start = time.monotonic()

    with status("Isolated leader") as say:
        def step(what: str) -> None:
            run.old_leader_process.append(lab.process_states()[LEADER])
            run.steps.append((round(time.monotonic() - start, 1), what))
            say(what)
            progress.step(what)

        for rec in first:
            producer.produce(topic, topics.encode(rec), partition=0, on_delivery=delivered)
        producer.flush(DELIVERY_TIMEOUT_MS / 1000 + 5)
        with Inspector(lab.broker(LEADER).address, timeout_s=5) as inspector:
            wait_until(lambda: inspector.offsets(topic)[0].high_watermark >= len(first),
                       "the followers to copy the first records", 30)
        step(f"{len(first)} records written, copied to all 3 (acknowledged: {len(acked_at)})")

        lab.isolate(LEADER)
        cut = time.monotonic()
        step("broker 1 isolated: its controller link and its followers' link cut")
        elected = _wait_for_new_leader(lab, topic)
        elected_at = time.monotonic()
        run.new_leader, run.election_s = elected.leader, round(elected_at - cut, 1)
        step(f"the controller fenced broker 1 and elected broker {elected.leader} "
             f"(epoch {elected.leader_epoch})")

        for i, rec in enumerate(second, 1):
            producer.produce(topic, topics.encode(rec), partition=0, on_delivery=delivered)
            until = elected_at + SPLIT_WRITE_S * i / len(second)
            while (left := until - time.monotonic()) > 0:  # poll returns at each callback
                producer.poll(left)
        step(f"{len(second)} more written during the split")
        producer.flush(DELIVERY_TIMEOUT_MS / 1000 + 5)
        settled = time.monotonic()
        wait_until(lambda: producer.poll(0.1) is not None and sending_to
                   and sending_to[-1][0] > settled, "the producer's statistics after its last "
                   "acknowledgement", 10)
        acked = {rid: (when, acknowledged_by(when)) for rid, when in acked_at.items()}
        during = [acked[r["id"]] for r in second if r["id"] in acked]
        step(f"{len(during)} of them acknowledged")
        run.old_leader_view = _view(lab, topic, LEADER)
        run.controller_view = _view(lab, topic, OTHERS[0])
        step(f"broker 1 says: {run.old_leader_view['text']}")
        step(f"broker 2 says: {run.controller_view['text']}")

        lab.heal()
        healed = time.monotonic()
        step("network healed")
        _wait_for_rejoin(lab, topic, elected.leader)
        run.rejoined_s = round(time.monotonic() - healed, 1)
        step(f"broker 1 follows broker {elected.leader} and has cut its log back to it")

    in_log = [r.value["id"] for r in topics.read(lab.broker(elected.leader).address, topic,
                                                 "read_uncommitted")]
    run.produced, run.during_split = len(inputs), len(second)
    run.acknowledged = len(acked)
    run.acknowledged_during_split = len(during)
    run.acknowledged_by = dict(Counter(str(leader) for _, leader in during))
    old_acks = [when for when, leader in during if leader == LEADER]
    if old_acks:
        run.old_leader_acknowledged_for_s = round(max(old_acks) - elected_at, 1)
    run.not_acknowledged = dict(refused)
    run.in_log = len(set(in_log))
    lost = set(acked) - set(in_log)
    run.lost_acknowledged = len(lost)
    run.lost_acknowledged_by = dict(Counter(str(acked[rid][1]) for rid in lost))
    run.duplicated = len(in_log) - len(set(in_log))
    return run


def check_settings(acks: str, min_insync: int, records: int) -> None:
    """A ValueError that says what to use, before any broker is started."""
    if acks not in ACKS:
        raise ValueError(f"acks must be one of {', '.join(ACKS)}, not {acks!r}")
    if min_insync not in (1, 2):
        raise ValueError(f"min_insync must be 1 or 2, not {min_insync}")
    if records < 4:
        raise ValueError(f"records must be 4 or more (half before the split, half during), "
                         f"not {records}")


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


def _run(context, *, acks: str, min_insync: int, records: int) -> IsolatedLeaderRun:
    return isolated_leader(context.cluster, acks, min_insync, records,
                           settings=context.pipeline or producer_settings)


register(Experiment(
    "isolated-leader", "the partition's leader cut off by a network partition keeps "
    "acknowledging while the controller elects another: what acks=1 loses when it heals",
    _run, where=FAILURE_LAB, stall_s=STALL_S, partitions=True,
    pipeline="the producer's settings (as producer_settings)",
    check=lambda acks, min_insync, records, **_: check_settings(acks, min_insync, records),
    text=lambda run: f"{run.summary()}\n{run.timeline()}", options=(
        Option("acks", REQUIRED, "the producer's acks", ACKS),
        Option("min_insync", 1, "the topic's min.insync.replicas", kind=int),
        Option("records", 40, "how many records (half during the split)", kind=int, short="-n"),
    )))
