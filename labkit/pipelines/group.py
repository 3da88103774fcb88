"""Reading the input as a member of a consumer group, as real applications do.

Every instance of a pipeline ``subscribe()``s to the input with the same group id; the
group coordinator divides the partitions among the live members and moves them when a
member joins, leaves or dies (a rebalance). The callbacks here keep track of what this
member owns, and drop records it polled but no longer owns (the new owner reads them again
from the committed offsets).

Two group protocols (``GROUP_PROTOCOLS``):

- ``classic``: members rejoin in rounds (JoinGroup / SyncGroup); librdkafka's default
  assignors revoke every partition at each rebalance (eager).
- ``consumer`` (KIP-848): the broker computes the assignment and moves only the partitions
  that change hands (incremental); members heartbeat their state.

A member that dies without leaving keeps its partitions until its session times out
(``SESSION_TIMEOUT_MS`` here; the lab broker sets the same for the consumer protocol).
With a ``instance_id`` (static membership) a restarted member takes its old place at once.

The input of a lab experiment is written before the pipeline starts, so "done" is known:
a member that owns every partition is done at their end; otherwise when every partition's
saved position (the group's committed offsets, or the sink's own table) has reached the end
of the input. An idle member (more instances than partitions) stops then too.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator

from confluent_kafka import (Consumer, ConsumerGroupState, KafkaError, KafkaException, Message,
                             TopicPartition)
from confluent_kafka.admin import AdminClient

from labkit.checking import history

from labkit.kafka import names
from labkit.kafka.clientlog import client_config
from labkit.faults.crashpoints import crash_point
from labkit.pipelines.common import (IDLE_TIMEOUT_S, PipelineError, StaleGeneration,
                                     committed_offsets)
from labkit.pipelines.guarantee import Guarantee

GROUP_PROTOCOLS = ("classic", "consumer")
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1000
DONE_CHECK_INTERVAL_S = 0.5

Positions = Callable[[list[int]], dict[int, int]]


def check_group_protocol(protocol: str) -> str:
    if protocol not in GROUP_PROTOCOLS:
        raise ValueError(f"unknown group protocol {protocol!r}; choose one of "
                         f"{', '.join(GROUP_PROTOCOLS)}")
    return protocol


def consumer_settings(bootstrap: str, group_id: str, guarantee: Guarantee, protocol: str,
                      instance_id: str | None = None) -> dict:
    """A group member's configuration: the guarantee's settings plus the group protocol's."""
    conf = {"bootstrap.servers": bootstrap, "group.id": group_id,
            "group.protocol": check_group_protocol(protocol),
            "enable.partition.eof": True, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50, **guarantee.consumer_settings()}
    if protocol == "classic":  # the consumer protocol takes these from the broker
        conf.update({"session.timeout.ms": SESSION_TIMEOUT_MS,
                     "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS})
    if instance_id:
        conf["group.instance.id"] = instance_id
    return conf


def first_start(group_size: int) -> int:
    """How many members to wait for: ``group_size`` when N instances start together, none
    after a restart (the others may have finished and left)."""
    return group_size if history.attempt() == 1 else 1


def bare_group_metadata(bootstrap: str, group_id: str) -> object:
    """Group metadata that names the group but no member or generation: what offsets sent
    to a transaction carried before KIP-447 (the broker then has nothing to fence with)."""
    outsider = Consumer(client_config({"bootstrap.servers": bootstrap, "group.id": group_id}))
    try:
        return outsider.consumer_group_metadata()
    finally:
        outsider.close()


class GroupInput:
    """This member's share of ``topic``, in batches, until the whole input is done.

    ``positions(partitions)`` says where the pipeline stands (default: the group's committed
    offsets); ``start(partitions)`` where a newly assigned partition is read from (default:
    the committed offsets; a sink that keeps offsets next to its rows passes its own).
    """

    def __init__(self, bootstrap: str, topic: str, group_id: str, guarantee: Guarantee, *,
                 protocol: str = "classic", instance_id: str | None = None,
                 positions: Positions | None = None, start: Positions | None = None,
                 wait_for_members: int = 1):
        # A learner's names or the broker's: the broker's, in the namespace (labkit.kafka.names).
        topic, group_id = names.topic(topic), names.group(group_id)
        self.topic = topic
        self.guarantee = guarantee
        self.consumer = Consumer(client_config(consumer_settings(bootstrap, group_id, guarantee,
                                                                 protocol, instance_id)))
        self.positions = positions or (lambda parts: committed_offsets(self.consumer, topic, parts))
        self.start = start
        # classic runs librdkafka's default (eager) assignors; the consumer protocol is incremental
        self.incremental = protocol == "consumer"
        self.assigned: set[int] = set()
        self.at_end: set[int] = set()
        self.pending: list[Message] = []
        self._ends: dict[int, int] | None = None
        self._next_done_check = 0.0
        self._group = (bootstrap, group_id)
        self._waiting_for = wait_for_members
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_revoke)
        history.record("subscribed")  # from here it asks the group for partitions

    # ------------------------------------------------------------------ rebalance callbacks

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = [tp.partition for tp in partitions]
        self.assigned |= set(parts)
        self.at_end -= set(parts)
        history.record("assigned", partitions=parts, owned=sorted(self.assigned))
        if self.start is None or not parts:
            return  # the client assigns them at the committed offsets
        where = self.start(parts)
        tps = [TopicPartition(self.topic, p, where[p]) for p in parts]
        if self.incremental:
            consumer.incremental_assign(tps)
        else:
            consumer.assign(tps)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = {tp.partition for tp in partitions}
        self.assigned -= parts
        self.at_end -= parts
        self.pending = self.guarantee.on_revoke(self.pending, {(self.topic, p) for p in parts})
        history.record("revoked", partitions=sorted(parts), owned=sorted(self.assigned))

    # ------------------------------------------------------------------ batches

    def batches(self, size: int) -> Iterator[list[Message]]:
        """Batches of up to ``size`` records from this member's partitions, until done.

        A batch is handed out once it is full, or once every owned partition is read to its
        end; the group metadata for its offsets is ``self.consumer.consumer_group_metadata()``
        taken right away, before anything else can poll.
        """
        self._await_members()
        deadline = time.monotonic() + IDLE_TIMEOUT_S
        while True:
            if self._poll(size - len(self.pending)):
                deadline = time.monotonic() + IDLE_TIMEOUT_S
            owned_done = self.assigned <= self.at_end  # also true with nothing assigned
            if len(self.pending) >= size or (self.pending and owned_done):
                batch, self.pending = self.pending[:size], self.pending[size:]
                yield batch
                deadline = time.monotonic() + IDLE_TIMEOUT_S
            elif owned_done and self._input_done():
                return
            elif self.assigned and time.monotonic() > deadline:
                raise PipelineError(f"no input for {IDLE_TIMEOUT_S:.0f} s and no end of partition: "
                                    "is the broker reachable?")

    def _await_members(self, timeout_s: float = 60.0) -> None:
        """Poll without processing until the group has ``wait_for_members`` members, so that
        N instances started together split the input before any of them works on it (the
        lab's experiments need to know which instance holds what; real apps just start)."""
        if self._waiting_for <= 1:
            return
        admin = AdminClient(client_config({"bootstrap.servers": self._group[0]}))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._poll(1)  # joins the group and serves rebalance callbacks
            try:
                group = admin.describe_consumer_groups([self._group[1]])[self._group[1]].result(10)
            except KafkaException:  # the coordinator is loading or moving: ask again
                time.sleep(0.2)
                continue
            if group.state == ConsumerGroupState.STABLE and len(group.members) >= self._waiting_for:
                break
            time.sleep(0.2)
        # What was polled meanwhile stays pending: it is this member's (a revoke drops it).
        history.record("members-joined", members=self._waiting_for, owned=sorted(self.assigned))

    def _poll(self, room: int) -> bool:
        msgs = self.consumer.consume(max(1, room), timeout=0.1)
        for msg in msgs:
            err = msg.error()
            if err is None:
                if msg.partition() in self.assigned:
                    self.pending.append(msg)
                    self.at_end.discard(msg.partition())
            elif err.code() == KafkaError._PARTITION_EOF:
                if msg.partition() in self.assigned:
                    self.at_end.add(msg.partition())
            elif err.fatal() or not err.retriable():
                raise KafkaException(err)
        return bool(msgs)

    def _input_done(self) -> bool:
        """Called when every owned partition is read to its end: is the whole input done?

        Yes if this member owns every partition (it has read them all), or if every
        partition's saved position has reached the end (the other members' work is saved).
        """
        now = time.monotonic()
        if now < self._next_done_check:
            return False
        self._next_done_check = now + DONE_CHECK_INTERVAL_S
        if self._ends is None:
            parts = self.consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
            self._ends = {p: self.consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), timeout=10, cached=False)[1] for p in sorted(parts)}
        if self.assigned == set(self._ends):
            return True
        where = self.positions(sorted(self._ends))
        return all(max(where.get(p, 0), 0) >= end for p, end in self._ends.items())

    def rewind(self, batch: list[Message]) -> None:
        """Read an abandoned batch again: every partition of it this member still owns goes
        back to the batch's first offset (its committed offset), and what was polled after
        it is dropped. Without this, the fetch position would run on past records whose
        output was aborted: lost. (Kafka's exactly-once examples reset to the last committed
        positions after every abort; with the consumer protocol a refused commit need not
        come with a revocation.)"""
        first: dict[int, int] = {}
        for m in batch:
            first[m.partition()] = min(m.offset(), first.get(m.partition(), m.offset()))
        self.pending = [m for m in self.pending if m.partition() not in first]
        for part, offset in sorted(first.items()):
            if part in self.assigned:
                self.consumer.seek(TopicPartition(self.topic, part, offset))
                self.at_end.discard(part)

    def close(self) -> None:
        """Leave the group (a dynamic member's partitions move at once) and close."""
        self.consumer.close()


def run_batches(source: GroupInput, batch_size: int,
                process: Callable[[list[Message]], None]) -> None:
    """Feed ``source``'s batches to ``process`` until the input is done.

    A batch the group refuses (this member's generation ended in a rebalance) is abandoned
    and rewound: whoever owns its partitions now (a new owner, or this member again)
    processes it from the committed offsets.
    """
    for batch in source.batches(batch_size):
        crash_point("after-poll-before-process")
        try:
            process(batch)
            history.record("processed", partitions=sorted({m.partition() for m in batch}),
                           records=len(batch))
        except StaleGeneration as exc:
            history.record("fenced", error=str(exc), records=len(batch))
            print(f"labkit: batch abandoned: {exc}", file=sys.stderr, flush=True)
            source.rewind(batch)
