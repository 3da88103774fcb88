"""Delta Lake sinks (sinks.DELTA_KINDS): a foreachBatch write Delta makes idempotent, and one not.

- ``delta``: every micro-batch is one Delta commit with the writer options ``txnAppId`` (the
  sink's table name: stable across restarts) and ``txnVersion`` = the micro-batch id, Delta's
  documented way to make ``foreachBatch`` idempotent. Delta stores (appId, version) as a
  ``txn`` action *in the same atomic commit* as the data files; a later write whose version
  is not above the stored one for that appId is skipped. A batch replayed after a crash
  between the sink and Spark's commit log comes back with the same batch id (the query
  resumes from its checkpoint, which planned it): Delta skips it.
- ``delta-append``: the same write without the two options: the replay is appended again.

The batch id is only a safe version while the checkpoint lives: a new checkpoint restarts
batch ids at 0 and Delta would skip every batch up to the stored version (use a new appId).

What the audit reads is what the table shows, through Spark (``read_job``, run by the
shared Spark worker) and through the transaction log itself (``log_entries``): the rows,
the commit version that added each row's file (the order the table shows: a commit is
atomic, within one the rows' own input offsets), ``DESCRIBE HISTORY``, and the ``txn``
entries. The sessions get Delta's SQL extension and catalog from ``labkit.spark.session``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from labkit.faults.crashpoints import crash_point
from labkit.spark.columns import RECORD_COLUMNS

COLUMNS = RECORD_COLUMNS  # the same record columns as the database sinks' tables
SCHEMA = ("id STRING, key STRING, value STRING, topic STRING, kafka_partition INT, "
          "kafka_offset BIGINT, batch_id INT")
_LOG_FILE = re.compile(r"^(\d{20})\.json$")


def app_id(table: str) -> str:
    """The txnAppId of a sink: one per table and query, the same after every restart."""
    return f"labkit-{table}"


def log_dir(path: str | Path) -> Path:
    return Path(path) / "_delta_log"


def latest_version(path: str | Path) -> int | None:
    """The table's newest commit version, from the transaction log's file names (None: no
    table yet)."""
    found = [int(m.group(1)) for f in log_dir(path).glob("*.json") if (m := _LOG_FILE.match(f.name))]
    return max(found) if found else None


def write_delta(kind: str, table: str, path: str, df, rows: list, batch_id: int) -> dict:
    """Write one micro-batch (``rows``, collected on the driver) to the Delta table at ``path``
    as one commit. Returns notes for the runner's event log: the version it made, or for the
    ``delta`` sink, that Delta skipped a txnVersion it already has."""
    spark = df.sparkSession
    frame = spark.createDataFrame(
        [(r["id"], r["key"], r["value"], r["topic"], r["partition"], r["offset"], batch_id)
         for r in rows], SCHEMA)
    before = latest_version(path)
    writer = frame.write.format("delta").mode("append")
    if kind == "delta":
        writer = writer.option("txnAppId", app_id(table)).option("txnVersion", batch_id)
    # A Delta write is one atomic commit: there is no half batch to leave behind. The point
    # is visited before the write, so a crash there leaves nothing of this batch.
    crash_point("spark-mid-sink")
    writer.save(path)
    return commit_notes(path, before, batch_id, len(rows))


def commit_notes(path: str, before: int | None, batch_id: int, rows: int) -> dict:
    """Notes for the runner's event log after a batch was written to the table at ``path``
    (``before``: its version until then): the commit it made, or that Delta skipped it."""
    after = latest_version(path)
    if after == before:  # no new commit: Delta saw (appId, version) already and wrote nothing
        return {"written": 0, "skipped": [f"txnVersion {batch_id} (table at v{after})"]}
    return {"written": rows, "applied": [f"v{after}"], "delta_version": after}


# ---------------------------------------------------------------- reading back (the audit)

def read_job(spark, job: dict, send) -> dict:
    """Worker job ``delta-read``: every row with the file it is stored in, and the table's
    ``DESCRIBE HISTORY``, read by Spark."""
    path = job["path"]
    df = spark.read.format("delta").load(path).select(*COLUMNS, "_metadata.file_name")
    rows = [list(r) for r in df.collect()]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select(
        "version", "operation", "operationMetrics").orderBy("version").collect()
    return {"rows": rows,
            "history": [{"version": int(h["version"]), "operation": h["operation"],
                         "rows": int((h["operationMetrics"] or {}).get("numOutputRows", 0))}
                        for h in history]}


def log_entries(path: str | Path) -> pd.DataFrame:
    """The transaction log as written: one row per commit version with its txn action
    (appId, version, or empty) and the data files it added."""
    out = []
    for f in sorted(log_dir(path).glob("*.json")):
        if not (m := _LOG_FILE.match(f.name)):
            continue
        txn, added = None, []
        for line in f.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                txn = action["txn"]
            if "add" in action:
                added.append(action["add"]["path"])
        out.append({"version": int(m.group(1)),
                    "txn_app_id": txn["appId"] if txn else "",
                    "txn_version": int(txn["version"]) if txn else None,
                    "files": added})
    return pd.DataFrame(out, columns=["version", "txn_app_id", "txn_version", "files"])
