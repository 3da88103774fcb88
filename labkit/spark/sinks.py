"""foreachBatch sinks, from naive to exactly-once, each with the ``spark-mid-sink`` crash point.

Every sink writes a micro-batch in two halves with ``crash_point("spark-mid-sink")`` between
them, so a crash there leaves exactly half a batch behind (or, for the transactional sink,
an open transaction that the database rolls back).

- ``naive``: INSERT every row. A replayed batch is inserted again: duplicates.
- ``idempotent``: upsert keyed by the record id. A replay rewrites the same rows.
- ``transactional``: rows and the next offset per partition in ONE transaction, applied only
  if the stored offset still equals the start of Spark's range for the batch (optimistic
  check); a replay of an applied batch is rolled back, a gap fails the query. The offsets
  stored are Spark's own range ends (``offsets/N``), not the rows' last offset + 1: on a
  transactional input, markers and aborted records take offsets no row shows. The query
  resumes from the database's offsets (``stored_offsets``), not from the checkpoint.
- ``batch-id``: what Spark's documentation recommends for ``foreachBatch``: rows and the
  batch id in ONE transaction, a batch id the query already recorded skipped (a replay:
  Spark re-runs a failed batch with the same id and, from the checkpoint's offsets, the same
  rows). It needs nothing a real ``foreachBatch`` function is not given; the restart keeps
  the checkpoint (a new one would number the batches from 0 again). No unique key on the
  rows: only the batch id check stops a replay (``recorded_batches``: what it recorded).
- ``kafka``: Spark's official Kafka sink (``df.write.format("kafka")``), at-least-once; the
  output key is the record id so a downstream reader can drop duplicates. The crash point
  ``spark-task-first-attempt`` makes one task of a batch's write fail once, under this sink
  or a learner's (``with_task_failure``).
- ``running-count``: the absolute running count per key from Spark's state store, upserted.
- ``increment-count``: per-batch counts added to the table (``total = total + n``): a replay
  adds them twice.
- ``delta`` / ``delta-append``: a Delta Lake table, one commit per batch, with or without
  Delta's idempotent-write options txnAppId/txnVersion (labkit.spark.delta).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from labkit.kafka import javaconfig
from labkit.faults.crashpoints import crash_point, halves, reached
from labkit.spark.columns import RECORD_COLUMNS, SEQUENCE_COLUMN
from labkit.storage.db import Database

SINK_KINDS = ("naive", "idempotent", "transactional", "batch-id", "kafka", "running-count",
              "increment-count", "delta", "delta-append")
DELTA_KINDS = ("delta", "delta-append")  # Delta Lake tables (labkit.spark.delta), not a database
STATEFUL_KINDS = ("running-count",)  # the query aggregates in Spark before the sink
OFFSETS_TABLE = "labkit_spark_offsets"
BATCHES_TABLE = "spark_batches"  # the batch-id sink's: (query, batch_id) per batch written


@dataclass(frozen=True)
class SinkSpec:
    """Where a sink writes; plain data so it crosses to the child process as JSON."""

    kind: str
    db_url: str | None = None
    table: str = "results"
    output_topic: str | None = None
    path: str | None = None  # a Delta table's directory (the delta sinks)

    def __post_init__(self):
        if self.kind not in SINK_KINDS:
            raise ValueError(f"unknown sink {self.kind!r}; valid sinks: {', '.join(SINK_KINDS)}")
        if self.kind == "kafka" and not self.output_topic:
            raise ValueError("the kafka sink needs output_topic")
        if self.kind in DELTA_KINDS and not self.path:
            raise ValueError(f"the {self.kind} sink needs path (the Delta table's directory)")
        if self.kind not in ("kafka", *DELTA_KINDS) and not self.db_url:
            raise ValueError(f"the {self.kind} sink needs db_url (sqlite:///file.db or a PostgreSQL DSN)")
        if not self.table.replace("_", "").isalnum():
            raise ValueError(f"table name {self.table!r}: use letters, digits and _ only")


class OffsetGap(RuntimeError):
    """The database's offset is behind the batch: applying it would skip records."""


def create_tables(spec: SinkSpec) -> None:
    """Create the sink's tables (idempotent); the kafka sink needs none, a Delta table is
    created by its first write."""
    if spec.kind in ("kafka", *DELTA_KINDS):
        return
    with Database(spec.db_url) as db:
        if spec.kind in ("running-count", "increment-count"):
            db.execute(f"CREATE TABLE IF NOT EXISTS {spec.table} (key TEXT PRIMARY KEY, total BIGINT NOT NULL)")
            return
        # naive and batch-id: no key stops a duplicate (batch-id's guard is its batch id)
        unique = "" if spec.kind in ("naive", "batch-id") else " NOT NULL UNIQUE"
        db.execute(f"CREATE TABLE IF NOT EXISTS {spec.table} ({db.sequence_column(SEQUENCE_COLUMN)}, "
                   f"id TEXT{unique}, key TEXT, value TEXT, topic TEXT, kafka_partition INTEGER, "
                   "kafka_offset BIGINT, batch_id INTEGER)")
        if spec.kind == "transactional":
            db.execute(f"CREATE TABLE IF NOT EXISTS {OFFSETS_TABLE} (sink TEXT, topic TEXT, "
                       "kafka_partition INTEGER, next_offset BIGINT NOT NULL, "
                       "PRIMARY KEY (sink, topic, kafka_partition))")
        if spec.kind == "batch-id":
            db.execute(f"CREATE TABLE IF NOT EXISTS {BATCHES_TABLE} (query TEXT NOT NULL, "
                       "batch_id BIGINT NOT NULL)")


def stored_offsets(spec: SinkSpec) -> dict[tuple[str, int], int]:
    """The transactional sink's committed position: (topic, partition) -> next offset to read."""
    with Database(spec.db_url) as db:
        rows = db.query(f"SELECT topic, kafka_partition, next_offset FROM {OFFSETS_TABLE} "
                        "WHERE sink = ?", (spec.table,))
    return {(t, int(p)): int(o) for t, p, o in rows}


def batch_query(spec: SinkSpec) -> str:
    """The name the batch-id sink records its batches under: the query's ``app_id``, which
    the lab passes a learner's sink too (one per table, the same after every restart)."""
    from labkit.spark.delta import app_id  # Delta's txnAppId: the same name, the same idea

    return app_id(spec.table)


def recorded_batches(spec: SinkSpec) -> list[int]:
    """The batch ids the batch-id sink recorded for its query, in order, repeats kept."""
    with Database(spec.db_url) as db:
        rows = db.query(f"SELECT batch_id FROM {BATCHES_TABLE} WHERE query = ? "
                        "ORDER BY batch_id", (batch_query(spec),))
    return [int(b) for (b,) in rows]


def _write_inhalves(db: Database, sql: str, items: list) -> None:
    """Two transactions with the mid-sink crash point between: a crash leaves half."""
    first, second = halves(items)
    with db.transaction():
        db.executemany(sql, first)
    crash_point("spark-mid-sink")
    with db.transaction():
        db.executemany(sql, second)


def _record_tuples(rows, batch_id: int) -> list[tuple]:
    return [(r["id"], r["key"], r["value"], r["topic"], r["partition"], r["offset"], batch_id)
            for r in rows]


_INSERT = f"INSERT INTO {{table}} ({', '.join(RECORD_COLUMNS)}) VALUES ({', '.join('?' * len(RECORD_COLUMNS))})"
_UPSERT = _INSERT + " ON CONFLICT (id) DO UPDATE SET " + ", ".join(
    f"{c} = excluded.{c}" for c in RECORD_COLUMNS[1:])


Range = tuple[int, int]  # [start, end) offsets of one partition in one micro-batch


def write_batch(spec: SinkSpec, df, rows: list, batch_id: int, bootstrap: str,
                ranges: dict[tuple[str, int], Range] | None = None) -> dict:
    """Write one micro-batch; ``rows`` are the batch collected on the driver (small batches).

    ``ranges`` is Spark's own offset range per (topic, partition) for this batch (from the
    checkpoint's ``offsets/N``); the transactional sink stores those ends. Without them it
    falls back to the rows' first and last offsets, which is only right when the input has
    no transaction markers or aborted records (offsets then are consecutive).
    Returns notes for the runner's event log (what was written or skipped).
    """
    if spec.kind == "kafka":
        return _write_kafka(spec, df, rows, bootstrap)
    if spec.kind in DELTA_KINDS:
        from labkit.spark.delta import write_delta  # Delta is loaded only by its sinks

        return write_delta(spec.kind, spec.table, spec.path, df, rows, batch_id)
    with Database(spec.db_url) as db:
        if spec.kind == "transactional":
            return _write_transactional(spec, db, rows, batch_id, ranges)
        if spec.kind == "batch-id":
            return _write_batch_id(spec, db, rows, batch_id)
        if spec.kind in ("running-count", "increment-count"):
            return _write_counts(spec, db, rows)
        sql = (_INSERT if spec.kind == "naive" else _UPSERT).format(table=spec.table)
        _write_inhalves(db, sql, _record_tuples(rows, batch_id))
        return {"written": len(rows)}


def _write_counts(spec: SinkSpec, db: Database, rows: list) -> dict:
    if spec.kind == "running-count":  # rows are (key, count) from the state store: absolute
        items = sorted((r["key"], int(r["count"])) for r in rows)
        sql = f"INSERT INTO {spec.table} (key, total) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET total = excluded.total"
    else:  # rows are input records: add this batch's counts to what is there
        items = sorted(Counter(r["key"] for r in rows).items())
        sql = f"INSERT INTO {spec.table} (key, total) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET total = {spec.table}.total + excluded.total"
    _write_inhalves(db, sql, items)
    return {"written": len(items)}


def _write_transactional(spec: SinkSpec, db: Database, rows: list, batch_id: int,
                         ranges: dict[tuple[str, int], Range] | None = None) -> dict:
    by_partition: dict[tuple[str, int], list] = {tp: [] for tp in ranges or {}}
    for r in rows:
        by_partition.setdefault((r["topic"], r["partition"]), []).append(r)
    if ranges is None:  # no range from Spark: assume consecutive offsets (no transactions)
        ranges = {tp: (min(r["offset"] for r in recs), max(r["offset"] for r in recs) + 1)
                  for tp, recs in by_partition.items()}
    applied, skipped = [], []
    with db.transaction():  # results and offsets commit together or not at all
        stored = {}
        for (topic, part) in by_partition:
            found = db.query(f"SELECT next_offset FROM {OFFSETS_TABLE} WHERE sink = ? AND topic = ? "
                             "AND kafka_partition = ?", (spec.table, topic, part))
            stored[(topic, part)] = found[0][0] if found else None
        todo = []
        for tp, recs in sorted(by_partition.items()):
            first, end = ranges[tp]
            if first == end:  # Spark planned nothing new on this partition
                continue
            have = stored[tp]
            if have is None or have == first:  # the optimistic check: still where we left off
                todo.append((tp, recs, end, have is None))
                applied.append(f"{tp[0]}/{tp[1]}:{first}-{end}")
            elif have >= end:  # this range is already in the database: a replay, skip it
                skipped.append(f"{tp[0]}/{tp[1]}:{first}-{end}")
            else:
                raise OffsetGap(f"{tp[0]}/{tp[1]}: the database is at offset {have} but the batch "
                                f"covers {first}-{end - 1}; applying it would lose or repeat records")
        records = [r for _, recs, _, _ in todo for r in recs]
        first_half, second_half = halves(_record_tuples(records, batch_id))
        sql = _INSERT.format(table=spec.table)
        db.executemany(sql, first_half)
        crash_point("spark-mid-sink")  # a crash here: the open transaction is rolled back
        db.executemany(sql, second_half)
        for (topic, part), _, end, new in todo:
            if new:
                db.execute(f"INSERT INTO {OFFSETS_TABLE} (sink, topic, kafka_partition, next_offset) "
                           "VALUES (?, ?, ?, ?)", (spec.table, topic, part, end))
            else:
                db.execute(f"UPDATE {OFFSETS_TABLE} SET next_offset = ? WHERE sink = ? AND topic = ? "
                           "AND kafka_partition = ?", (end, spec.table, topic, part))
    return {"written": len(records), "applied": applied, "skipped": skipped}


def _write_batch_id(spec: SinkSpec, db: Database, rows: list, batch_id: int) -> dict:
    """The lab's copy of 08b's ``ledger_sink``: a batch id already recorded is a replay."""
    query = batch_query(spec)
    with db.transaction():  # the rows and the batch id commit together, or neither
        last = db.query(f"SELECT MAX(batch_id) FROM {BATCHES_TABLE} WHERE query = ?",
                        (query,))[0][0]
        if last is not None and batch_id <= last:
            return {"written": 0, "skipped": [f"batch {batch_id}"]}
        first, second = halves(_record_tuples(rows, batch_id))
        sql = _INSERT.format(table=spec.table)
        db.executemany(sql, first)
        crash_point("spark-mid-sink")  # a crash here: the open transaction is rolled back
        db.executemany(sql, second)
        db.execute(f"INSERT INTO {BATCHES_TABLE} (query, batch_id) VALUES (?, ?)",
                   (query, batch_id))
    return {"written": len(rows), "skipped": []}


class TaskFailure(RuntimeError):
    """Raised inside a Spark task on its first attempt (crash point spark-task-first-attempt)."""


TASK_FAILURE = "spark-task-first-attempt"


def with_task_failure(frame, rows: list, marker: str):
    """The batch as the sink gets it: unchanged, except in the micro-batch the crash point
    ``spark-task-first-attempt`` is armed for (counted once per batch: call this once per
    batch), where one task fails once (``fail_first_attempt``) under whatever sink writes
    the frame, the lab's or the learner's. ``rows``: the batch as collected (the first row
    names the task: the one reading input partition 0); ``marker``: a file path of this
    batch's that the failed task creates."""
    if reached(TASK_FAILURE) and rows:
        return fail_first_attempt(frame, rows[0]["id"], marker)
    return frame


def fail_first_attempt(frame, row_id: str, marker: str):
    """``frame`` with one executor-side failure: the task whose rows include the id
    ``row_id``, on its first attempt only, hands half of its rows on and then fails.
    Written to the Kafka sink, that half is already sent when the task dies; Spark retries
    the task (local[2,4]: up to 4 attempts) and the retry sends the whole partition again,
    within the same micro-batch.

    The task is found by a row it holds, not by its index: the order of a Kafka batch's
    input partitions among its tasks is not fixed from one run to the next. It fails once
    (``marker``, created as it fails, is seen by any later task): a sink that reads the
    batch twice (the lab's writes it in two halves, two Spark jobs whose tasks are each a
    first attempt) has only its first read of those rows fail."""
    import os

    from pyspark import TaskContext

    def run(chunks):
        chunks = list(chunks)
        if TaskContext.get().attemptNumber() > 0 or os.path.exists(marker) \
                or not any((c["id"] == row_id).any() for c in chunks):
            yield from chunks
            return
        import pandas as pd

        rows = pd.concat(chunks, ignore_index=True)
        done = len(rows) // 2
        yield rows.iloc[:done]  # an Arrow batch the Kafka writer sends before the failure
        open(marker, "x").close()
        raise TaskFailure(f"the task holding {row_id} failed on attempt 0 after {done} of "
                          f"{len(rows)} rows ({TASK_FAILURE})")

    return frame.mapInPandas(run, frame.schema)


def _write_kafka(spec: SinkSpec, df, rows: list, bootstrap: str) -> dict:
    from pyspark.sql import functions as F

    first, _ = halves([r["id"] for r in rows])
    out = df.select(F.col("id").alias("key"), F.col("value"))
    in_first = F.col("key").isin(first) if first else F.lit(False)

    def save(part) -> None:
        (part.write.format("kafka").options(**javaconfig.spark_options(bootstrap))
         .option("topic", spec.output_topic).save())

    save(out.filter(in_first))
    crash_point("spark-mid-sink")
    save(out.filter(~in_first))
    return {"written": len(rows)}
