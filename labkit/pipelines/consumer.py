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

from labkit.faults.crashpoints import halves, crash_point
from labkit.pipelines.common import next_offsets, record_of
from labkit.pipelines.group import GroupInput, first_start, run_batches
from labkit.pipelines.guarantee import guarantee as guarantee_named

SINK_TABLE = "payments"
COLUMNS = ("id", "key", "amount_cents", "currency", "ts")


def connect(db_path: str) -> sqlite3.Connection:
    """The sink database; autocommit mode, so every statement is durable on its own."""
    db = sqlite3.connect(db_path, isolation_level=None, timeout=30)
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


def stored_offsets(db: sqlite3.Connection, topic: str) -> dict[int, int]:
    rows = db.execute("SELECT partition, next_offset FROM kafka_offsets WHERE topic = ?",
                      (topic,)).fetchall()
    return dict(rows)


class TableTransaction:
    """The database's own transaction, in the shape the exactly_once guarantee drives: the
    rows and the input offsets commit in *one* DB transaction, so the table is the truth."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")  # several instances may share the file

    def save_offsets(self, offsets) -> None:
        self.db.executemany("INSERT OR REPLACE INTO kafka_offsets VALUES (?, ?, ?)",
                            [(tp.topic, tp.partition, tp.offset) for tp in offsets])

    def commit(self) -> None:
        self.db.execute("COMMIT")

    def abort_after_error(self) -> None:
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")


def run(bootstrap: str, input_topic: str, group_id: str, db_path: str, guarantee: str,
        batch_size: int = 10, group_protocol: str = "classic",
        instance_id: str | None = None, group_size: int = 1) -> None:
    """Consume ``input_topic`` to its end into ``db_path``; resume where the guarantee says.

    at_most_once / at_least_once keep their position in the group's committed offsets;
    exactly_once keeps it in the database, next to the rows, and starts every partition it
    is assigned from there.
    """
    g = guarantee_named(guarantee)
    with closing(connect(db_path)) as db:
        table = TableTransaction(db)
        in_table = g.transactional
        # The ``start``/``positions`` callbacks run inside poll(), between batches.
        from_table = (lambda parts: {p: stored_offsets(db, input_topic).get(p, 0) for p in parts})
        with closing(GroupInput(bootstrap, input_topic, group_id, g, protocol=group_protocol,
                                instance_id=instance_id,
                            wait_for_members=first_start(group_size),
                                positions=from_table if in_table else None,
                                start=from_table if in_table else None)) as source:
            def process(batch: list[Message]) -> None:
                offsets = next_offsets(batch)
                if in_table:
                    g.run_batch(table, lambda: _insert_each(db, batch),
                                lambda: table.save_offsets(offsets))
                else:
                    g.run_batch(None, lambda: _insert_each(db, batch),
                                lambda: g.commit_offsets(None, source.consumer, offsets))

            run_batches(source, batch_size, process)


def _insert_each(db, batch: list[Message]) -> None:
    """Insert row by row with the mid-batch crash point halfway. Outside BEGIN each row
    commits on its own (a crash leaves half a batch behind); inside, nothing is kept."""
    first, rest = halves(batch)
    for msg in first:
        insert(db, msg)
    crash_point("mid-batch")
    for msg in rest:
        insert(db, msg)
