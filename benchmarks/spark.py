"""Measure the Spark lesson's costs: worker start, micro-batch latency, a crash cycle, JVM RSS.

    LABKIT_BOOTSTRAP=127.0.0.1:9092 python benchmarks/spark.py   # or with a `labkit up` lab

Prints markdown rows for docs/measurements-spark.md. Small scale on purpose (60 records,
20 per micro-batch): the lesson's numbers, not a benchmark of Spark. The first lines say
which pyspark and connector jars ran and the load average at start and end (the machine
is shared: the load moves these numbers more than anything).

Another Spark version (e.g. the 4.0.0 the lab pinned before): a throwaway venv with that
pyspark whose .pth adds this checkout and the lab's venv after its own site-packages, and
the matching connector jars (resolved offline from the pom with -Dspark.version=4.0.0):

    LABKIT_SPARK_JARS=$(ls /tmp/jars-400/*.jar | paste -sd,) /tmp/venv400/bin/python benchmarks/spark.py
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from labkit import proc

from labkit.kafka import cluster

from labkit.pipelines import data
from labkit.spark import runner
from labkit.spark.runner import SparkWorker, StreamJob
from labkit.spark.supervised import run_until_done
from labkit.spark.sinks import SinkSpec

RECORDS, PER_BATCH, REPEATS = 60, 20, 3


def vm_hwm_mb(pid: int) -> float:
    return proc.peak_rss_mb(pid)  # Linux's VmHWM: the most it ever had resident


def job(bootstrap: str, workdir: Path, kind: str = "naive") -> StreamJob:
    topic = f"measure-{uuid.uuid4().hex[:8]}"
    data.load_into_topic(bootstrap, topic, data.generate(RECORDS, seed=0), partitions=2)
    return StreamJob(query="measure", topic=topic, bootstrap=bootstrap,
                     checkpoint=str(workdir / topic), max_offsets_per_trigger=PER_BATCH,
                     sink=SinkSpec(kind, db_url=f"sqlite:///{workdir}/{topic}.db", table="t"))


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    import pyspark

    from labkit.spark.session import MASTER

    jars = os.environ.get("LABKIT_SPARK_JARS") or "pinned (labkit.kafka.jvm.resolve('spark'))"
    print(f"pyspark {pyspark.__version__}, master {MASTER}, connector jars: "
          f"{', '.join(Path(j).name for j in jars.split(',')) if ',' in jars else jars}")
    print(f"start {time.strftime('%H:%M:%S')}, load average (1/5/15 min) {load()}")
    bootstrap = cluster.ensure().bootstrap
    workdir = Path(tempfile.mkdtemp(prefix="labkit-measure-spark-"))
    rows: list[tuple[str, str]] = []

    starts = []
    for _ in range(REPEATS):  # one at a time: a worker start alone on the machine
        with SparkWorker().start() as w:
            starts.append(w.startup_s)
    rows.append(("Spark worker start (python -m labkit.spark.child to SparkSession ready), "
                 f"median of {REPEATS}", f"{statistics.median(starts):.1f} s"))

    warm = runner.shared_worker()
    cold = run_until_done(job(bootstrap, workdir))  # the warm worker's first query
    warm_runs = [run_until_done(job(bootstrap, workdir)) for _ in range(REPEATS)]
    first = [e["seconds"] for e in cold.attempts[0].events if e["event"] == "batch-end"][0]
    later = [e["seconds"] for r in warm_runs for e in r.attempts[0].events
             if e["event"] == "batch-end"]
    starts_t = [[e["t"] for e in r.attempts[0].events if e["event"] == "batch-start"] for r in warm_runs]
    gaps = [b - a for ts in starts_t for a, b in zip(ts, ts[1:])]
    query_start = [ts[0] for ts in starts_t]
    rows += [
        ("first micro-batch of a new JVM (collect + naive SQLite sink)", f"{first:.2f} s"),
        (f"micro-batch, warm JVM ({PER_BATCH} records: collect + SQLite sink), median",
         f"{statistics.median(later):.2f} s"),
        ("batch start to next batch start (incl. commit + planning), warm, median",
         f"{statistics.median(gaps):.2f} s"),
        ("query start to first batch, warm, median", f"{statistics.median(query_start):.2f} s"),
    ]

    runner.warm_up()  # a spare crash worker ready, as in a series of experiments
    cycles, armed, restart, jvm_exit = [], [], [], []
    for _ in range(REPEATS):
        started = time.monotonic()
        run = run_until_done(job(bootstrap, workdir), "spark-after-sink-before-commit", hit=2)
        cycles.append(time.monotonic() - started)
        armed.append(run.attempts[0].seconds)
        restart.append(run.attempts[1].seconds)
        jvm_exit.append(run.attempts[0].jvm_exit_s)
        runner.warm_up()  # measure each cycle with its spare ready
    rows += [
        ("crash-restart-replay cycle (spark-after-sink-before-commit on batch 2 of 3, naive sink, "
         "spare worker ready), median", f"{statistics.median(cycles):.1f} s"),
        ("  of which: armed attempt until SIGKILL", f"{statistics.median(armed):.1f} s"),
        ("  of which: restart from the checkpoint (replay + last batch, warm worker)",
         f"{statistics.median(restart):.1f} s"),
        ("JVM exit after its driver was SIGKILLed (gateway pipe EOF)",
         f"{statistics.median(jvm_exit):.2f} s"),
        ("peak RSS (VmHWM) of the warm worker's Spark JVM after all runs",
         f"{vm_hwm_mb(warm.jvm_pid):.0f} MB"),
    ]
    runner.close_workers()
    shutil.rmtree(workdir, ignore_errors=True)  # the runs' checkpoints and SQLite files
    print(f"end {time.strftime('%H:%M:%S')}, load average (1/5/15 min) {load()}")
    print("| measurement | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
