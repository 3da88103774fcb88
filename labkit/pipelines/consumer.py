"""A consumer that writes payments into a database table (SQLite), under one guarantee.

- at_most_once: commit the offsets in Kafka, *then* insert the rows. A crash in between
  skips the batch.
- at_least_once: insert the rows (each its own DB commit, as a naive sink does), *then*
  commit the offsets in Kafka. A crash in between inserts the batch again.
- exactly_once: rows and the next offsets go into the database in *one* DB transaction; on
  start the consumer reads its position from that table, not from Kafka. A crash before the
  DB commit rolls both back; after it, both are there.
"""
from __future__ import annotations

import sqlite3
from contextlib import closing

from confluent_kafka import Message

from labkit.faults.crashpoints import crash_point, halves
from labkit.pipelines.common import (check_guarantee, next_offsets, open_input,
                                     record_of, run_batches, with_offsets)

SINK_TABLE = "payments"
COLUMNS = ("id", "key", "amount_cents", "currency", "ts")


def connect(db_path: str) -> sqlite3.Connection:
    """The sink database; autocommit mode, so every statement is durable on its own."""
    db = sqlite3.connect(db_path, isolation_level=None)
    # WAL + synchronous=NORMAL: a process kill never loses a committed row (a power cut could).
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(f"CREATE TABLE IF NOT EXISTS {SINK_TABLE} "
               "(id TEXT, key TEXT, amount_cents INTEGER, currency TEXT, ts INTEGER)")
    db.execute("CREATE TABLE IF NOT EXISTS kafka_offsets "
               "(topic TEXT, partition INTEGER, next_offset INTEGER, PRIMARY KEY (topic, partition))")
    return db


def insert(db: sqlite3.Connection, msg: Message) -> None:
    row = record_of(msg)
    db.execute(f"INSERT INTO {SINK_TABLE} VALUES (?, ?, ?, ?, ?)", [row.get(c) for c in COLUMNS])


def stored_offsets(db: sqlite3.Connection, topic: str) -> dict[int, int] | None:
    rows = db.execute("SELECT partition, next_offset FROM kafka_offsets WHERE topic = ?",
                      (topic,)).fetchall()
    return dict(rows) or None


def run(bootstrap: str, input_topic: str, group_id: str, db_path: str, guarantee: str,
        batch_size: int = 10) -> None:
    """Consume ``input_topic`` to its end into ``db_path``; resume where the guarantee says."""
    check_guarantee(guarantee)
    with closing(connect(db_path)) as db:
        # exactly_once keeps its position in the database, next to the rows.
        start = stored_offsets(db, input_topic) if guarantee == "exactly_once" else None
        consumer = open_input(bootstrap, input_topic, group_id, start=start)
        with closing(consumer):
            run_batches(consumer, batch_size, lambda batch: _process(db, consumer, batch, guarantee))


def _process(db, consumer, batch: list[Message], guarantee: str) -> None:
    offsets = next_offsets(batch)
    if guarantee != "exactly_once":
        with_offsets(guarantee, consumer, offsets, lambda: _insert_each(db, batch))
        return
    db.execute("BEGIN")
    _insert_each(db, batch)
    crash_point("after-process-before-commit")
    db.executemany("INSERT OR REPLACE INTO kafka_offsets VALUES (?, ?, ?)",
                   [(tp.topic, tp.partition, tp.offset) for tp in offsets])
    db.execute("COMMIT")
    crash_point("after-commit")


def _insert_each(db, batch: list[Message]) -> None:
    """Insert row by row with the mid-batch crash point halfway. Outside BEGIN each row
    commits on its own (a crash leaves half a batch behind); inside, nothing is kept."""
    first, rest = halves(batch)
    for msg in first:
        insert(db, msg)
    crash_point("mid-batch")
    for msg in rest:
        insert(db, msg)
