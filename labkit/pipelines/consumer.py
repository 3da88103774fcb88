"""A consumer that writes payments into a database table (a SQLite file, or PostgreSQL
through a DSN: labkit.storage.db), under one guarantee.

- at_most_once: commit the offsets in Kafka, *then* insert the rows. A crash in between
  skips the batch.
- at_least_once: insert the rows (each its own DB commit, as a naive sink does), *then*
  commit the offsets in Kafka. A crash in between inserts the batch again.
- exactly_once: rows and the next offsets go into the database in *one* DB transaction; on
  start the consumer reads its position from that table, not from Kafka. A crash before the
  DB commit rolls both back; after it, both are there.
"""
from __future__ import annotations

from contextlib import closing

from confluent_kafka import Message

from labkit.faults.crashpoints import halves, crash_point
from labkit.pipelines.common import next_offsets, record_of
from labkit.pipelines.group import GroupInput, first_start, run_batches
from labkit.pipelines.guarantee import guarantee as guarantee_named
from labkit.storage.db import Database

SINK_TABLE = "payments"
COLUMNS = ("id", "key", "amount_cents", "currency", "ts")
_INSERT = f"INSERT INTO {SINK_TABLE} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


def connect(db: str) -> Database:
    """The sink database (a SQLite file or a PostgreSQL DSN), its tables created; autocommit
    mode, so every statement is durable on its own."""
    conn = Database(db, wal=True)  # several instances may share a SQLite file
    # PostgreSQL keeps no insertion order: the audit reads the rows by this column's
    # (SQLite numbers its rows itself: the audit reads them by rowid, as before).
    order = f"{conn.sequence_column('seq')}, " if conn.kind == "postgresql" else ""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {SINK_TABLE} "
                 f"({order}id TEXT, key TEXT, amount_cents INTEGER, currency TEXT, ts BIGINT)")
    conn.execute("CREATE TABLE IF NOT EXISTS kafka_offsets "
                 "(topic TEXT, partition INTEGER, next_offset BIGINT, PRIMARY KEY (topic, partition))")
    return conn


def insert(db: Database, msg: Message) -> None:
    row = record_of(msg)
    db.execute(_INSERT, [row.get(c) for c in COLUMNS])


def stored_offsets(db: Database, topic: str) -> dict[int, int]:
    rows = db.query("SELECT partition, next_offset FROM kafka_offsets WHERE topic = ?", (topic,))
    return dict(rows)


class TableTransaction:
    """The database's own transaction, in the shape the exactly_once guarantee drives: the
    rows and the input offsets commit in *one* DB transaction, so the table is the truth."""

    def __init__(self, db: Database):
        self.db = db

    def begin(self) -> None:
        self.db.begin()  # SQLite: the write lock up front, several instances may share the file

    def save_offsets(self, offsets) -> None:
        self.db.executemany("INSERT INTO kafka_offsets VALUES (?, ?, ?) ON CONFLICT "
                            "(topic, partition) DO UPDATE SET next_offset = excluded.next_offset",
                            [(tp.topic, tp.partition, tp.offset) for tp in offsets])

    def commit(self) -> None:
        self.db.commit()

    def abort_after_error(self) -> None:
        if self.db.in_transaction:
            self.db.rollback()


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
