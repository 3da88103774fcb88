"""Delta Lake sink vs the SQLite sinks: micro-batch latency, measured on real Spark.

    LABKIT_BOOTSTRAP=127.0.0.1:9092 .venv/bin/python benchmarks/spark_delta.py [RECORDS] [PER_BATCH]

One warm Spark worker runs the same query (RECORDS generated payments on 2 partitions,
PER_BATCH per micro-batch, no crash) into each sink in turn, twice (the first round warms
the JVM for that sink). For each sink it prints the median and max of the sink's time per
micro-batch (``batch-end`` seconds: collect + write, as the worker times it) of the second
round, the first batch left out (a new query's first batch pays query start), and the
load average. Results: docs/measurements-spark.md, "Delta Lake sink".
"""
from __future__ import annotations

import math
import os
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from labkit.pipelines import data
from labkit.spark import runner
from labkit.storage.db import default_url
from labkit.spark.runner import StreamJob
from labkit.spark.supervised import run_until_done
from labkit.spark.sinks import DELTA_KINDS, SinkSpec

SINKS = ("naive", "idempotent", "transactional", "delta", "delta-append")


def one_run(bootstrap: str, kind: str, records: int, per_batch: int) -> list[float]:
    work = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
    topic = f"bench-delta-{kind}-{uuid.uuid4().hex[:8]}"
    data.load_into_topic(bootstrap, topic, data.generate(records, seed=0), partitions=2)
    table = f"{kind.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    sink = (SinkSpec(kind, table=table, path=str(work / "table")) if kind in DELTA_KINDS
            else SinkSpec(kind, db_url=default_url(work), table=table))
    job = StreamJob(query=f"bench-{kind}", topic=topic, bootstrap=bootstrap,
                    checkpoint=str(work / "checkpoint"), sink=sink,
                    max_offsets_per_trigger=per_batch)
    try:
        run = run_until_done(job, resume="database" if kind == "transactional" else "checkpoint")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ends = [e for e in run.attempts[0].events if e["event"] == "batch-end"]
    assert sum(e["rows"] for e in ends) == records and math.ceil(records / per_batch) == len(ends)
    return [e["seconds"] for e in ends]


def main(argv: list[str]) -> None:
    bootstrap = os.environ["LABKIT_BOOTSTRAP"]
    records, per_batch = (int(argv[0]), int(argv[1])) if len(argv) > 1 else (200, 20)
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    for kind in SINKS:
        one_run(bootstrap, kind, records, per_batch)  # warm-up round for this sink
        seconds = one_run(bootstrap, kind, records, per_batch)[1:]
        print(f"{kind:14s} {len(seconds)} batches of {per_batch}: median "
              f"{statistics.median(seconds):.2f} s, max {max(seconds):.2f} s "
              f"(load {os.getloadavg()[0]:.1f})")
    runner.close_workers()


if __name__ == "__main__":
    main(sys.argv[1:])
