"""What every reference pipeline shares: client tuning, delivery reports, offsets, batches.

The guarantee-specific decisions (producer settings, isolation, commit order) live in
``labkit.pipelines.guarantee``; reading the input as a group member in
``labkit.pipelines.group``. What is here is the same under every guarantee.
"""
from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message,
                             Producer, TopicPartition)

from labkit.kafka import names, topics
from labkit.faults.crashpoints import at_normal_end, crash_point, halves

# A dropped produce ack is retried after this long; Kafka's default (30 s) would make a
# lost-ack experiment wait half a minute.
REQUEST_TIMEOUT_MS = 3000
# Long enough that records produced just before a crash point are still in the client's
# buffer when the process dies; flush() sends at once regardless.
LINGER_MS = 50
# The lab's producer tuning, the same under every guarantee (the guarantee adds its own).
PIPELINE_TUNING = {"linger.ms": LINGER_MS, "request.timeout.ms": REQUEST_TIMEOUT_MS}
IDLE_TIMEOUT_S = 60.0

# What the group coordinator answers a member whose generation has ended (a rebalance
# gave its partitions to someone else): its offset commit is refused.
GROUP_FENCING_ERRORS = (KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
                        KafkaError.FENCED_INSTANCE_ID, KafkaError.REBALANCE_IN_PROGRESS,
                        KafkaError.STALE_MEMBER_EPOCH, KafkaError.FENCED_MEMBER_EPOCH)


class PipelineError(RuntimeError):
    """A pipeline cannot go on; the message says why."""


class StaleGeneration(RuntimeError):
    """The group refused this member's offsets: its partitions now belong to another member.

    The batch is abandoned (a transaction is aborted); the member polls again, rejoins the
    group and goes on with whatever partitions it is given."""


class DeliveryTracker:
    """Delivery reports of one producer: errors raise at flush (fire and forget ignores them).

    ``acknowledged=False``: the producer runs with acks=0 (see ``drain``)."""

    def __init__(self, producer: Producer, strict: bool, acknowledged: bool = True):
        self.producer = producer
        self.strict = strict
        self.errors: list[str] = []
        self._known_topics: dict[str, str] = {}  # name given -> the broker's name
        if not acknowledged:  # a worker that ends normally waits for the broker (drain)
            at_normal_end(self.drain)

    def __call__(self, err, msg: Message) -> None:
        if err is not None:
            self.errors.append(str(err))

    def produce(self, topic: str, key: str | None, value: object) -> None:
        name = self._known_topics.get(topic)
        if name is None:
            # A learner's name or the broker's: the broker's (labkit.kafka.names), once per topic.
            name = names.topic(topic)
            # Learn the topic's leaders *before* the first record. Otherwise records wait for
            # metadata longer than linger.ms and go out as soon as it arrives, splitting what
            # the pipeline produced together over several requests, so a lost ack would
            # duplicate a varying number of records.
            try:
                self.producer.list_topics(name, timeout=10)
            except KafkaException:
                pass  # a fault on the line right now: produce() fetches metadata itself
            self._known_topics[topic] = name
        self.producer.produce(name, key=None if key is None else key.encode(),
                              value=topics.encode(value), on_delivery=self)
        self.producer.poll(0)

    def flush(self, timeout_s: float = 60.0) -> None:
        left = self.producer.flush(timeout_s)
        if self.strict and (left or self.errors):
            raise PipelineError(f"{left} record(s) not delivered within {timeout_s:.0f} s; "
                                f"errors: {self.errors[:3]}")

    def drain(self, timeout_s: float = 30.0) -> None:
        """Return once the broker has handled every request this producer has sent.

        With acks=0, flush() returns when the requests are written to the socket. The broker
        handles one request per connection at a time, so they may still wait there when
        the worker exits, and an audit on a new connection can read the log first: the one
        cause found for a CI run whose audit read 0 of 50 records with no fault, reproduced by
        holding produce requests back (tests/test_pipelines_matrix.py). A question on the
        same connection is answered only after everything sent before it: one metadata
        request per topic written to. (It reaches one broker: exact for the lab's single
        broker, best effort with several.)
        """
        self.producer.flush(timeout_s)
        for name in set(self._known_topics.values()):
            try:
                self.producer.list_topics(name, timeout=timeout_s)
            except KafkaException:
                pass  # the broker is gone or cut off: nothing more it will append


def committed_offsets(consumer: Consumer, topic: str, partitions: Iterable[int],
                      timeout_s: float = 30.0) -> dict[int, int]:
    """The group's committed offset per partition (OFFSET_BEGINNING where none)."""
    wanted = [TopicPartition(topic, p) for p in partitions]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = consumer.committed(wanted, timeout=min(10.0, timeout_s))
            return {tp.partition: tp.offset if tp.offset >= 0 else OFFSET_BEGINNING for tp in got}
        except KafkaException as exc:
            # Right after a broker start the group coordinator may still be loading.
            if time.monotonic() > deadline or not exc.args[0].retriable() and \
                    exc.args[0].code() != KafkaError.NOT_COORDINATOR:
                raise
            time.sleep(0.2)


def next_offsets(batch: list[Message], delta: int = 1) -> list[TopicPartition]:
    """Offsets to commit after ``batch``: the *next* record to read (last + 1) per partition.

    ``delta=0`` is the off-by-one trap (committing the last record's own offset).
    """
    last: dict[tuple[str, int], int] = {}
    for m in batch:
        last[(m.topic(), m.partition())] = max(m.offset(), last.get((m.topic(), m.partition()), -1))
    return [TopicPartition(t, p, o + delta) for (t, p), o in sorted(last.items())]


def commit(consumer: Consumer, offsets: list[TopicPartition]) -> None:
    """A synchronous offset commit that raises if the broker refused it."""
    try:
        results = consumer.commit(offsets=offsets, asynchronous=False) or []
    except KafkaException as exc:
        raise _stale_or(exc) from exc
    for tp in results:
        if tp.error is not None:
            raise _stale_or(KafkaException(tp.error))


def _stale_or(exc: KafkaException) -> Exception:
    err: KafkaError = exc.args[0]
    if err.code() in GROUP_FENCING_ERRORS:
        return StaleGeneration(f"offset commit refused by the group coordinator: {err.name()} "
                               f"({err.str()}); the partitions went to another member")
    return exc


def record_of(msg: Message) -> dict:
    return topics.decode(msg.value())


def produce_in_halves(out, topic: str, items: list[tuple[str, object]]) -> None:
    """Produce (key, value) pairs: the first half flushed (delivered), then the rest.

    The two crash points in here are what "mid-batch" and "after-produce-before-flush" mean
    for a Kafka output: half the batch delivered, and half delivered plus half still in the
    client's buffer (linger.ms keeps it there).
    """
    first, rest = halves(items)
    for key, value in first:
        out.produce(topic, key, value)
    out.flush(60)
    crash_point("mid-batch")
    for key, value in rest:
        out.produce(topic, key, value)
    crash_point("after-produce-before-flush")
    out.flush(60)
