"""An app's progress as Kafka shows it: its group's committed offsets on the input, the
input's end, the output's size; and whether the group is waiting rather than stuck.

    with GroupProgress(bootstrap, input_topic, output_topic, group, history_file) as watch:
        consumed, end, written = watch.sample()
        watch.waiting(instances_alive=1)   # 'a dead member holds 1 partition ...' or None

A judge that restarts a killed app must tell a slow app from a stalled one. A SIGKILLed
member stays in its group until its session times out (``session.timeout.ms``, 45 s by
default in librdkafka and the Java client); until then its replacement waits, either in a
rebalance that waits for the dead member (the classic protocol) or with no partitions
(KIP-848). ``waiting`` asks the group coordinator which: the group is rebalancing, or it
has more members than the app has live instances. Each change of progress is a
``progress`` event in the run's history: the timeline of the app's commits and writes.

Consumed means what a restart would not read again. A committed offset is the next record
to read, so a loop that commits each partition's last record + 1 has consumed all of a
partition whose log ends in a COMMIT marker or in an upstream's aborted records, though its
offset stops short of the log's end: a read_committed consumer starting there receives
nothing. So each partition counts as consumed to its end once no record a read_committed
reader receives lies at or past its committed offset (``unread``: how many do, by partition).
"""
from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import (OFFSET_BEGINNING, Consumer, ConsumerGroupState, IsolationLevel,
                             KafkaException, TopicPartition)
from confluent_kafka.admin import AdminClient, OffsetSpec

from labkit.checking import history
from labkit.kafka import topics
from labkit.kafka.clientlog import client_config
from labkit.kafka.inspect import InspectError, Inspector
from labkit.kafka.inspect.client import OPEN_STATES

SAMPLE_EVERY_S = 0.5
RENEW_S = 15.0  # no answer this long: the watching consumer is made anew
# Kafka's own topics a transactional loop writes through its coordinators.
INTERNAL = ("__consumer_offsets", "__transaction_state")
# Group states in which the coordinator is moving partitions, not handing out work.
REBALANCING = {ConsumerGroupState.PREPARING_REBALANCING, ConsumerGroupState.COMPLETING_REBALANCING}


class GroupProgress:
    """``output_topic`` None: nothing written is counted here (a subclass counts it where the
    app writes: ``labkit.checking.table_progress``)."""

    def __init__(self, bootstrap: str, input_topic: str, output_topic: str | None, group: str,
                 history_file: Path | None = None):
        self.input, self.output, self.group = input_topic, output_topic, group
        self.history_file, self.bootstrap = history_file, bootstrap
        self.consumer = self._consumer()
        self.admin = self._admin()
        self.in_parts = [TopicPartition(input_topic, p)
                         for p in topics.partitions_of(bootstrap, input_topic)]
        self.out_parts = [TopicPartition(output_topic, p)
                          for p in topics.partitions_of(bootstrap, output_topic)] \
            if output_topic else []
        self.reader = _Readable(bootstrap, self.in_parts)
        self.last = (0, self._first_end(), 0)
        self.next_at = 0.0
        self.ok = False  # did the last sample get an answer? (else ``last`` is old news)
        self.failing_since: float | None = None
        self.grouped = False  # has the app's group had members (it uses the group)?
        self.unread: dict[int, int] = {}  # partition -> records a restart would read again

    def _consumer(self) -> Consumer:
        # Same group id as the app, but this consumer never subscribes or commits: it only
        # asks the coordinator for the committed offsets, which does not join the group.
        return Consumer(client_config({
            "bootstrap.servers": self.bootstrap, "group.id": self.group,
            "enable.auto.commit": False,
            # the committed offsets as they stand: read_committed would ask for stable ones
            # (KIP-447), and the answer waits while a transaction that sent offsets is open
            # (an instance killed in one: until its successor aborts it)
            "isolation.level": "read_uncommitted",
            "log_level": 0}))  # connection-refused noise while a broker restarts

    def _ends(self, parts: list[TopicPartition]) -> dict[tuple[str, int], int]:
        """Each partition's end (its high watermark). A schedule waiting for the app's next
        commit samples about ten times a second, and the consumer's get_watermark_offsets
        costs two ListOffsets requests a partition: the broker's busiest work in a capstone
        verdict. So the admin client asks for all of them at once; where it answers no end
        (after a partition leader's restart it was seen to answer negative ones for minutes,
        and a judge-coordinator run stalled), the consumer asks, and the admin client is
        made anew."""
        if not parts:
            return {}
        try:
            futures = self.admin.list_offsets({tp: OffsetSpec.latest() for tp in parts},
                                              request_timeout=2)
            ends = {(tp.topic, tp.partition): future.result(timeout=3).offset
                    for tp, future in futures.items()}
            if all(end >= 0 for end in ends.values()):
                return ends
        except (KafkaException, TimeoutError):
            pass
        if time.monotonic() - self._admin_made > RENEW_S:
            # (not at every failing sample: dropping a client destroys it, which waits for
            # its requests in flight, and the samples come twice a second)
            self.admin = self._admin()
        return {(tp.topic, tp.partition): self.consumer.get_watermark_offsets(
            tp, timeout=2, cached=False)[1] for tp in parts}

    def _admin(self) -> AdminClient:
        self._admin_made = time.monotonic()
        return AdminClient(client_config({"bootstrap.servers": self.bootstrap, "log_level": 0}))

    def _first_end(self, within_s: float = 30.0) -> int:
        """The input's end before the first sample: asked again while the broker is slow to
        answer (a loaded machine: 2 s was seen to pass), until ``within_s``."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                return sum(self._ends(self.in_parts).values())
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def sample(self, fresh: bool = False) -> tuple[int, int, int]:
        """(offsets committed, input end, output records); at most twice a second unless
        ``fresh``, and the last answer while the broker cannot say (it may be restarting:
        ``ok`` then says False, and nothing may be decided on it)."""
        if not fresh and time.monotonic() < self.next_at:
            return self.last
        self.next_at = time.monotonic() + SAMPLE_EVERY_S
        try:
            # the input's end too: input may still be arriving (a judge's feed)
            ends = self._ends(self.in_parts + self.out_parts)
            committed = self.offsets_committed(ends)
            end = sum(ends[tp.topic, tp.partition] for tp in self.in_parts)
            now = (committed, end, self.written(ends))
        except Exception as exc:  # KafkaException / timeouts during a broker restart
            self._failed(exc)
            return self.last
        self.ok, self.failing_since = True, None
        if now != self.last and self.history_file is not None:
            # unread: what a restart from these offsets would read again, by partition (a
            # checker's "offsets behind" is a function of the history)
            again = {str(p): n for p, n in self.unread.items() if n}
            history.append(self.history_file, "progress", committed=now[0], end=now[1],
                           output=now[2], **({"unread": again} if again else {}))
        self.last = now
        return self.last

    def offsets_committed(self, ends: dict[tuple[str, int], int] | None = None) -> int:
        """The group's committed offsets on the input, summed over its partitions; a
        partition with nothing left that a read_committed restart would receive counts as
        consumed to its end (its committed offset may stop before a marker). ``ends``: the
        partitions' ends if just asked."""
        committed = {tp.partition: max(tp.offset, 0)
                     for tp in self.consumer.committed(self.in_parts, timeout=2)}
        ends = ends if ends is not None else self._ends(self.in_parts)
        ends = {tp.partition: ends[tp.topic, tp.partition] for tp in self.in_parts}
        self.unread = self.reader.unread(committed, ends)
        return sum(ends[p] if self.unread.get(p) == 0 else committed[p] for p in committed)

    def written(self, ends: dict[tuple[str, int], int] | None = None) -> int:
        """What the app has written: the output topic's records (``ends``: as just asked)."""
        ends = ends if ends is not None else self._ends(self.out_parts)
        return sum(ends[tp.topic, tp.partition] for tp in self.out_parts)

    def _failed(self, exc: Exception) -> None:
        """No answer. After RENEW_S of them the consumer is made anew: one that lost its
        group's coordinator to a broker kill was seen to stay without one for minutes."""
        self.ok, now = False, time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
            if self.history_file is not None:
                history.append(self.history_file, "progress-unknown", error=str(exc)[:200])
        elif now - self.failing_since > RENEW_S:
            self.failing_since = now
            self.consumer.close()
            self.consumer = self._consumer()

    def describe(self):
        """The group as its coordinator describes it now (a ConsumerGroupDescription), or
        None when it cannot say (a broker restarting, the group just made)."""
        try:
            (future,) = self.admin.describe_consumer_groups([self.group],
                                                            request_timeout=5).values()
            return future.result(timeout=6)
        except Exception:  # KafkaException, a timeout
            return None

    def waiting(self, instances_alive: int) -> str | None:
        """Why the group hands out no work now, if the coordinator says it is waiting: a
        rebalance in progress, members the app no longer runs (dead ones whose session has
        not timed out yet), or fewer members than the app runs (an instance just started has
        not joined yet: on a loaded machine a start takes seconds), or the coordinator of a
        group that has had members did not answer (a judge that cannot tell a wait from a
        stall does not call it a stall: the run's own timeout still ends an app that never
        moves), or a partition the app needs is not whole again (``recovering``). None:
        nothing to wait for."""
        recovering = self.recovering()
        if recovering is not None:
            return recovering
        group = self.describe()
        if group is None:  # (a group never seen with members may just not exist: no wait)
            return ("the group's coordinator did not answer in time (a broker restarting, a "
                    "loaded machine): no stall called on a guess") if self.grouped else None
        self.grouped = self.grouped or bool(group.members)
        if group.state in REBALANCING:
            return f"the group is rebalancing ({group.state.name.lower()})"
        extra = len(group.members) - instances_alive
        if extra > 0:
            return (f"the group still has {extra} member(s) more than the app runs: a killed "
                    "instance's session has not timed out yet")
        if extra < 0 and self.grouped:  # an app that uses the group, not assign()
            return f"{-extra} instance(s) of the app not in the group yet (joining)"
        return None

    def recovering(self) -> str | None:
        """Which partitions the app needs (its input and output, its group's offsets, its
        transactions' state) have no leader or replicas out of sync, as the cluster's
        metadata says now: a restarted broker still catching up. Until it has, writes to a
        partition whose in-sync replicas fell below min.insync.replicas are refused
        (NOT_ENOUGH_REPLICAS, retried by the client), and so are the coordinators' own: an
        app that commits nothing then waits for the cluster, it is not stuck. So does one
        whose input has a transaction open (its last stable offset below its end: a
        read_committed reader receives nothing past it until it ends, its coordinator just
        restarted, say). None: every one whole, or the cluster unanswered (``describe``
        then says so)."""
        short = self._out_of_sync()
        if short:  # (one sentence while it lasts: the run's steps say each reason once)
            return (f"partitions it needs have replicas out of sync ({short[0]} among them): "
                    "a restarted broker is still catching up")
        unstable = self._input_unstable()
        if unstable:
            return (f"{self.input}-{min(unstable)} has a transaction open (its last stable "
                    "offset is below its end): a read_committed reader waits for its end")
        return None

    def state(self) -> dict:
        """What the cluster says now, as plain data for the run's history (the supervision
        records it when it calls a stall): the partitions out of sync, the input's
        partitions with a transaction open ([last stable offset, end]), the group's state
        and members, the transactions open on the output and in what state (one stuck in
        PrepareCommit is a coordinator that has not written its markers)."""
        group = self.describe()
        return {"out_of_sync": self._out_of_sync()[:8],
                "input_open": {str(p): v for p, v in self._input_unstable().items()},
                "group": group.state.name.lower() if group else "unanswered",
                "members": len(group.members) if group else None,
                "transactions": self._transactions()}

    def _transactions(self) -> dict[str, str]:
        """The open transactions writing to the output: transactional id -> state."""
        if not self.output:
            return {}
        try:
            with Inspector(self.bootstrap, timeout_s=5) as inspector:
                return {t.transactional_id: t.state
                        for t in inspector.transactions(OPEN_STATES, topic=self.output)}
        except (InspectError, OSError):
            return {}

    def _out_of_sync(self) -> list[str]:
        try:
            topics = self.admin.list_topics(timeout=3).topics
        except KafkaException:
            return []
        return sorted(f"{name}-{p.id}" for name in (self.input, self.output, *INTERNAL)
                      if name and (meta := topics.get(name)) is not None
                      for p in meta.partitions.values()
                      if p.leader < 0 or len(p.isrs) < len(p.replicas))

    def _input_unstable(self) -> dict[int, list[int]]:
        """The input's partitions whose last stable offset is below their end: partition
        -> [last stable offset, end] (none when the broker does not answer)."""
        try:
            futures = self.admin.list_offsets(
                {tp: OffsetSpec.latest() for tp in self.in_parts},
                isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=2)
            stable = {tp.partition: f.result(timeout=3).offset for tp, f in futures.items()}
            ends = self._ends(self.in_parts)
        except (KafkaException, TimeoutError):
            return {}
        return {p: [lso, ends[self.input, p]] for p, lso in sorted(stable.items())
                if 0 <= lso < ends[self.input, p]}

    def members(self) -> list[tuple[str, str | None]] | None:
        """The group's members as (member id, group.instance.id or None), as its
        coordinator says now; None when it cannot say (a broker restarting)."""
        group = self.describe()
        return None if group is None else [(m.member_id, m.group_instance_id)
                                           for m in group.members]

    def formed(self, members: int) -> bool:
        """Has the group settled with ``members`` members or more: stable (no rebalance
        under way), every partition of the input assigned, and each member with partitions
        of its own where there are enough to go round? (A member listed while a rebalance
        is under way may have none yet; work fed then would never reach it.)"""
        group = self.describe()
        if group is None:
            return False
        owned = [{(tp.topic, tp.partition) for tp in
                  (m.assignment.topic_partitions if m.assignment else ())}
                 for m in group.members]
        wanted = {(tp.topic, tp.partition) for tp in self.in_parts}
        each_has_some = len(wanted) < len(owned) or all(owned)
        return (group.state == ConsumerGroupState.STABLE and len(group.members) >= members
                and wanted <= set().union(*owned) and each_has_some)

    def __enter__(self) -> "GroupProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.consumer.close()
        self.reader.close()


class _Readable:
    """The input as a read_committed reader receives it: each partition's offsets of the
    records it gets (an upstream's aborted records and the markers are never among them)."""

    def __init__(self, bootstrap: str, parts: list[TopicPartition]):
        self.consumer = Consumer(client_config({
            "bootstrap.servers": bootstrap, "group.id": f"{parts[0].topic}-readable",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "log_level": 0}))  # it only reads (assign): it never joins that group
        self.consumer.assign([TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING)
                              for tp in parts])
        self.received: dict[int, list[int]] = {tp.partition: [] for tp in parts}

    def _drain(self) -> None:
        while messages := self.consumer.consume(1000, timeout=0.05):
            for m in messages:
                if m.error() is None:
                    self.received[m.partition()].append(m.offset())

    def unread(self, committed: dict[int, int], ends: dict[int, int]) -> dict[int, int]:
        """For each partition this reader has read to its end: how many of the records it
        received lie at or past ``committed`` (what a restart from there reads again).
        Partitions it has not read to their end yet are left out (nothing known)."""
        self._drain()
        read_to = {tp.partition: tp.offset for tp in self.consumer.position(
            [TopicPartition(tp.topic, tp.partition) for tp in self.consumer.assignment()])}
        return {p: sum(o >= committed[p] for o in self.received[p]) for p in committed
                if read_to.get(p, -1) >= ends.get(p, 0) or not ends.get(p, 0)}

    def close(self) -> None:
        self.consumer.close()
