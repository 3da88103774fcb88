"""A plain confluent-kafka consumer that writes payments into PostgreSQL, four ways: the lab's
reference for the ``kafka-to-database`` experiment (notebook 05c writes the same loops).

- ``commit-first``: commit the offsets in Kafka, then insert the rows. A crash between
  the two skips the batch: its rows are **lost**.
- ``insert-first``: insert the rows (each durable at once, as a plain insert is), then
  commit the offsets in Kafka. A crash between inserts the batch again: **duplicates**.
- ``offsets-in-database``: the rows and each partition's next offset in **one database
  transaction**; on assignment a partition starts where the database says (not where Kafka's
  committed offsets say: this consumer never commits any). The offsets update is guarded,
  ``UPDATE offsets SET off = :until WHERE ... AND off = :from``: if another instance moved
  the partition on meanwhile (a rebalance), nothing is updated, the transaction is rolled
  back and the partitions go back to the stored positions.
- ``idempotent``: ``INSERT ... ON CONFLICT (id) DO NOTHING`` (the table's unique id), then
  commit the offsets in Kafka: a replayed batch writes no row twice. Its limit: whatever is
  not keyed by the id, such as a running count per account, is counted again.

The tables (``create_tables``, made by the lab before the consumers start)::

    payments (seq   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- insertion order
              id    text NOT NULL [UNIQUE],  account text NOT NULL,  amount_cents integer NOT NULL)
    accounts (account text PRIMARY KEY, payments integer NOT NULL)   -- a running count
    offsets  (topic text, part integer, off bigint NOT NULL, PRIMARY KEY (topic, part))

It runs until it is stopped, as a service does (the lab stops it once its input is consumed).
"""
from __future__ import annotations

import json

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from labkit.faults.crashpoints import crash_point, halves
from labkit.kafka.clientlog import client_config
from labkit.storage.db import Database

APPROACHES = {
    "commit-first": "commit the offsets in Kafka, then insert the rows",
    "insert-first": "insert the rows, then commit the offsets in Kafka",
    "offsets-in-database": "the rows and the next offsets in one database transaction",
    "idempotent": "INSERT ... ON CONFLICT (id) DO NOTHING, then commit the offsets in Kafka",
}
# What each approach promises, in the audit's words.
GUARANTEES = {"commit-first": "at_most_once", "insert-first": "at_least_once",
              "offsets-in-database": "exactly_once", "idempotent": "exactly_once"}
# The crash points each approach's loop passes, in the order it passes them.
CRASH_POINTS = {
    "commit-first": ("after-poll-before-process", "after-commit-before-process", "mid-batch"),
    "insert-first": ("after-poll-before-process", "mid-batch", "after-process-before-commit",
                     "after-commit"),
    "offsets-in-database": ("after-poll-before-process", "mid-batch",
                            "in-transaction-before-commit", "after-commit"),
    "idempotent": ("after-poll-before-process", "mid-batch", "after-process-before-commit",
                   "after-commit"),
}
BATCH = 10
ROWS = "SELECT COUNT(*) FROM payments"  # what the consumers have written
POSITIONS = "SELECT COALESCE(SUM(off), 0) FROM offsets WHERE topic = ?"  # how far they got
COUNTS = ("accounts", "account", "payments")  # the running count: table, key, count


def create_tables(dsn: str, topic: str, partitions: int, unique_ids: bool) -> None:
    """The three tables, and one offsets row per partition of ``topic`` (offset 0: nothing
    consumed yet). ``unique_ids``: the payments' id is a key the database enforces (what
    ``ON CONFLICT (id)`` needs); without it a row written twice is there twice."""
    with Database(dsn) as db:
        db.execute(f"CREATE TABLE payments ({db.sequence_column('seq')}, "
                   f"id text NOT NULL{' UNIQUE' if unique_ids else ''}, "
                   "account text NOT NULL, amount_cents integer NOT NULL)")
        db.execute("CREATE TABLE accounts (account text PRIMARY KEY, payments integer NOT NULL)")
        db.execute("CREATE TABLE offsets (topic text, part integer, off bigint NOT NULL, "
                   "PRIMARY KEY (topic, part))")
        db.executemany("INSERT INTO offsets (topic, part, off) VALUES (?, ?, 0)",
                       [(topic, p) for p in range(partitions)])


def run(bootstrap: str, input_topic: str, group_id: str, instance_id: str, dsn: str,
        approach: str, totals: bool = False, batch_size: int = BATCH) -> None:
    """Consume ``input_topic`` into ``dsn``'s tables the ``approach`` way, until stopped.
    ``totals``: also keep the running count of payments per account."""
    if approach not in APPROACHES:
        raise ValueError(f"approach must be one of {', '.join(APPROACHES)}, not {approach!r}")
    db = Database(dsn)  # autocommit: each statement outside a transaction is durable at once
    in_db = approach == "offsets-in-database"
    consumer = Consumer(client_config({
        "bootstrap.servers": bootstrap, "group.id": group_id,
        "group.instance.id": instance_id,  # a restarted instance takes its partitions back
        "heartbeat.interval.ms": 500,  # a rebalance is noticed within 0.5 s (default 3 s)
        "enable.auto.commit": False, "auto.offset.reset": "earliest"}))

    def stored(partitions: list[TopicPartition]) -> list[TopicPartition]:
        where = dict(db.query("SELECT part, off FROM offsets WHERE topic = ?", (input_topic,)))
        return [TopicPartition(p.topic, p.partition, where[p.partition]) for p in partitions]

    def on_assign(c: Consumer, partitions: list[TopicPartition]) -> None:
        c.assign(stored(partitions) if in_db else partitions)

    def write(batch: list[Message]) -> None:
        first, rest = halves(batch)
        for msg in first:
            insert(db, json.loads(msg.value()), approach == "idempotent", totals)
        crash_point("mid-batch")
        for msg in rest:
            insert(db, json.loads(msg.value()), approach == "idempotent", totals)

    consumer.subscribe([input_topic], on_assign=on_assign)
    while True:
        batch = [m for m in consumer.consume(batch_size, timeout=1.0) if m.error() is None]
        if not batch:
            continue
        crash_point("after-poll-before-process")
        if approach == "commit-first":
            consumer.commit(asynchronous=False)
            crash_point("after-commit-before-process")
            write(batch)
        elif in_db:
            db.begin()
            write(batch)
            if not move_offsets(db, input_topic, batch):
                db.rollback()  # another instance moved a partition on: not ours any more
                rewind(consumer, stored([TopicPartition(input_topic, p)
                                         for p in {m.partition() for m in batch}]))
                continue
            crash_point("in-transaction-before-commit")
            db.commit()
            crash_point("after-commit")
        else:  # insert-first, idempotent
            write(batch)
            crash_point("after-process-before-commit")
            consumer.commit(asynchronous=False)
            crash_point("after-commit")


def insert(db: Database, payment: dict, idempotent: bool, totals: bool) -> None:
    on_conflict = " ON CONFLICT (id) DO NOTHING" if idempotent else ""
    db.execute("INSERT INTO payments (id, account, amount_cents) VALUES (?, ?, ?)" + on_conflict,
               (payment["id"], payment["key"], payment["amount_cents"]))
    if totals:
        db.execute("INSERT INTO accounts (account, payments) VALUES (?, 1) ON CONFLICT "
                   "(account) DO UPDATE SET payments = accounts.payments + 1", (payment["key"],))


def move_offsets(db: Database, topic: str, batch: list[Message]) -> bool:
    """Each partition of the batch moved from its first offset to its last + 1, only where the
    database still has it at that first offset; False if any was not (it moved on)."""
    span: dict[int, list[int]] = {}
    for m in batch:
        span.setdefault(m.partition(), [m.offset(), m.offset()])[1] = m.offset()
    return all(db.execute("UPDATE offsets SET off = ? WHERE topic = ? AND part = ? AND off = ?",
                          (last + 1, topic, part, first)) == 1
               for part, (first, last) in span.items())


def rewind(consumer: Consumer, positions: list[TopicPartition]) -> None:
    """Each partition still assigned back to its stored position (one revoked meanwhile is
    another instance's now)."""
    for tp in positions:
        try:
            consumer.seek(tp)
        except KafkaException:
            pass
