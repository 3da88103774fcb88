"""A Delta table read back by a Spark worker: its rows with the commit that added each, and
its history (above the runner, which owns the workers; Delta itself stays below it)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from labkit.spark import delta
from labkit.spark.runner import shared_worker


def read_table(path: str | Path, worker=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(records, history) of the Delta table at ``path``, read by a Spark worker.

    ``records`` has COLUMNS plus ``delta_version`` (the commit that added the row's file),
    in the order the table shows: by commit, then by input position within a commit (a
    commit is atomic, so inside one there is no other order to see). ``history`` is
    DESCRIBE HISTORY (version, operation, rows written) joined with the log's txn entries.
    """
    res = (worker or shared_worker()).run({"op": "delta-read", "path": str(path)}).result
    log = delta.log_entries(path)
    version_of = {Path(f).name: v for v, files in zip(log["version"], log["files"]) for f in files}
    records = pd.DataFrame(res["rows"], columns=[*delta.COLUMNS, "file_name"])
    records["delta_version"] = [version_of[Path(f).name] for f in records["file_name"]]
    records = (records.drop(columns="file_name")
               .sort_values(["delta_version", "kafka_partition", "kafka_offset"], kind="stable")
               .reset_index(drop=True))
    history = pd.DataFrame(res["history"], columns=["version", "operation", "rows"]).merge(
        log[["version", "txn_app_id", "txn_version"]], on="version", how="left")
    return records, history
