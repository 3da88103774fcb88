"""What every reference pipeline shares: the guarantee setting, client configs, batches.

One setting, ``processing_guarantee``, picks the client configuration (as in Kafka Streams):

- ``at_most_once``: fire and forget (acks=0, no retries); offsets are committed *before*
  the work, so a crash skips records but never repeats them.
- ``at_least_once``: acks=all and retries; offsets are committed *after* the work, so a
  crash repeats records but never skips them.
- ``exactly_once``: a transactional producer; output and input offsets commit together.

Batches are fixed-size and the input has one partition, so a crash on the N-th visit of a
crash point always hits the same records: the audit's numbers are the same on every run.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message,
                             Producer, TopicPartition)

from labkit import topics
from labkit.faults.crashpoints import crash_point, halves

if TYPE_CHECKING:
    from labkit.pipelines.txn import Transactions

GUARANTEES: tuple[str, ...] = ("at_most_once", "at_least_once", "exactly_once")
# A dropped produce ack is retried after this long; Kafka's default (30 s) would make a
# lost-ack experiment wait half a minute.
REQUEST_TIMEOUT_MS = 3000
# Long enough that records produced just before a crash point are still in the client's
# buffer when the process dies; flush() sends at once regardless.
LINGER_MS = 50
IDLE_TIMEOUT_S = 60.0


class PipelineError(RuntimeError):
    """A pipeline cannot go on; the message says why."""


def check_guarantee(guarantee: str) -> str:
    if guarantee not in GUARANTEES:
        raise ValueError(f"unknown processing guarantee {guarantee!r}; choose one of "
                         f"{', '.join(GUARANTEES)}")
    return guarantee


def producer_config(bootstrap: str, guarantee: str, transactional_id: str | None = None,
                    idempotent: bool | None = None) -> dict:
    """Producer settings for a guarantee; ``idempotent`` overrides the guarantee's default."""
    check_guarantee(guarantee)
    conf = {"bootstrap.servers": bootstrap, "linger.ms": LINGER_MS,
            "request.timeout.ms": REQUEST_TIMEOUT_MS}
    if guarantee == "at_most_once":
        conf.update({"acks": 0, "retries": 0, "enable.idempotence": False})
    elif guarantee == "at_least_once":
        conf.update({"acks": "all", "retries": 2_147_483_647, "enable.idempotence": False,
                     "max.in.flight.requests.per.connection": 5})
    else:
        if not transactional_id:
            raise ValueError("exactly_once needs a transactional_id")
        conf.update({"transactional.id": transactional_id, "enable.idempotence": True,
                     "acks": "all", "transaction.timeout.ms": 60_000})
    if idempotent is not None and guarantee != "exactly_once":
        conf["enable.idempotence"] = idempotent
        if idempotent:
            conf.update({"acks": "all", "retries": 2_147_483_647})
    return conf


class DeliveryTracker:
    """Delivery reports of one producer: errors raise at flush (fire and forget ignores them)."""

    def __init__(self, producer: Producer, strict: bool):
        self.producer = producer
        self.strict = strict
        self.errors: list[str] = []
        self._known_topics: set[str] = set()

    def __call__(self, err, msg: Message) -> None:
        if err is not None:
            self.errors.append(str(err))

    def produce(self, topic: str, key: str | None, value: object) -> None:
        if topic not in self._known_topics:
            # Learn the topic's leaders *before* the first record. Otherwise records wait for
            # metadata longer than linger.ms and go out as soon as it arrives, splitting what
            # the pipeline produced together over several requests, so a lost ack would
            # duplicate a varying number of records.
            try:
                self.producer.list_topics(topic, timeout=10)
            except KafkaException:
                pass  # a fault on the line right now: produce() fetches metadata itself
            self._known_topics.add(topic)
        self.producer.produce(topic, key=None if key is None else key.encode(),
                              value=topics.encode(value), on_delivery=self)
        self.producer.poll(0)

    def flush(self, timeout_s: float = 60.0) -> None:
        left = self.producer.flush(timeout_s)
        if self.strict and (left or self.errors):
            raise PipelineError(f"{left} record(s) not delivered within {timeout_s:.0f} s; "
                                f"errors: {self.errors[:3]}")


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


def open_input(bootstrap: str, topic: str, group_id: str, isolation: str = "read_committed",
               start: dict[int, int] | None = None) -> Consumer:
    """A consumer on every partition of ``topic`` at ``start`` (default: the group's commits).

    Partitions are assigned, not subscribed: a restarted worker resumes at once instead of
    waiting for the crashed member's session to time out and the group to rebalance.
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group_id, "enable.auto.commit": False,
        "isolation.level": isolation, "enable.partition.eof": True,
        "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50,
    })
    if start is None:
        start = committed_offsets(consumer, topic, topics.partitions_of(bootstrap, topic))
    topics.assign_all(consumer, topic, start)
    return consumer


def next_batch(consumer: Consumer, size: int,
               idle_timeout_s: float = IDLE_TIMEOUT_S) -> tuple[list[Message], bool]:
    """Up to ``size`` records, and whether the end of every assigned partition was reached.

    The input is written before a pipeline starts, so reaching the end means done.
    """
    batch: list[Message] = []
    at_end: set[int] = set()
    assigned = {tp.partition for tp in consumer.assignment()}
    deadline = time.monotonic() + idle_timeout_s
    while len(batch) < size and at_end != assigned:
        msgs = consumer.consume(size - len(batch), timeout=0.1)
        for msg in msgs:
            err = msg.error()
            if err is None:
                batch.append(msg)
                at_end.discard(msg.partition())
            elif err.code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition())
            elif err.fatal() or not err.retriable():
                raise KafkaException(err)
        if msgs:
            deadline = time.monotonic() + idle_timeout_s
        elif time.monotonic() > deadline:
            raise PipelineError(f"no input for {idle_timeout_s:.0f} s and no end of partition: "
                                "is the broker reachable?")
    return batch, at_end == assigned


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
    for tp in consumer.commit(offsets=offsets, asynchronous=False) or []:
        if tp.error is not None:
            raise KafkaException(tp.error)


def output_for(bootstrap: str, guarantee: str, transactional_id: str,
               idempotent: bool | None = None):
    """The pipeline's producer and the isolation level its input is read with.

    exactly_once: a transactional producer, initialised *before* anything is read, because
    init_transactions() aborts what a crashed predecessor left open; only then are its
    committed offsets and changelog final (read_committed).
    """
    from labkit.pipelines.txn import Transactions  # here: txn imports this module

    if guarantee == "exactly_once":
        return Transactions(bootstrap, transactional_id), "read_committed"
    producer = Producer(producer_config(bootstrap, guarantee, idempotent=idempotent))
    return DeliveryTracker(producer, strict=guarantee == "at_least_once"), "read_uncommitted"


def run_batches(consumer: Consumer, batch_size: int, process: Callable[[list[Message]], None]) -> None:
    """Feed fixed-size batches to ``process`` until the end of the input."""
    while True:
        batch, at_end = next_batch(consumer, batch_size)
        if batch:
            crash_point("after-poll-before-process")
            process(batch)
        if at_end:
            return


def with_offsets(guarantee: str, consumer: Consumer, offsets: list[TopicPartition],
                 work: Callable[[], None]) -> None:
    """The whole difference between the two weaker guarantees: when offsets are committed.

    at_most_once commits first, then works (a crash in between skips the batch);
    at_least_once works first, then commits (a crash in between repeats the batch).
    """
    if guarantee == "at_most_once":
        commit(consumer, offsets)
        crash_point("after-commit-before-process")
        work()
    elif guarantee == "at_least_once":
        work()
        crash_point("after-process-before-commit")
        commit(consumer, offsets)
        crash_point("after-commit")
    else:
        raise ValueError(f"with_offsets is for at_most_once / at_least_once, not {guarantee}")


OFFSET_MODES = ("in-transaction", "outside-before-commit", "outside-after-commit")


def in_transaction(txn: "Transactions", consumer: Consumer, offsets: list[TopicPartition],
                   work: Callable[[], None], offsets_mode: str = "in-transaction") -> None:
    """exactly_once: the work and the input offsets commit together, in one transaction.

    The other ``offsets_mode`` values are the classic mistake, for the pitfalls lesson:
    offsets committed by the consumer, outside the transaction, before or after its commit.
    """
    txn.begin()
    work()
    crash_point("in-transaction-before-commit")
    if offsets_mode == "in-transaction":
        txn.send_offsets(consumer, offsets)
    elif offsets_mode == "outside-before-commit":
        commit(consumer, offsets)  # the mistake: these offsets survive an abort
    crash_point("after-send-offsets-before-commit")
    txn.commit()
    crash_point("after-commit")
    if offsets_mode == "outside-after-commit":
        commit(consumer, offsets)  # the mistake: a crash just before this repeats the batch


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
    out.flush()
    crash_point("mid-batch")
    for key, value in rest:
        out.produce(topic, key, value)
    crash_point("after-produce-before-flush")
    out.flush()
