"""Spark scenarios for `labkit scenario spark-...`: one streaming query, one crash, one audit.

Each entry maps a scenario name to a function
``(bootstrap: str, guarantee: str, crash_at: str | None, records: int) -> AuditReport``.

The input is ``records`` generated records (labkit.data, seed 0) on a 2-partition topic, read
in 3 micro-batches (maxOffsetsPerTrigger = ceil(records / 3)); a crash point fires on its
2nd visit, i.e. in or right after the 2nd micro-batch. The restart runs until the input is
fully processed; then the audit compares what the sink left with the input, and the counts
per key with a Spark batch recomputation of the input topic.

How ``guarantee`` maps (anything else is refused with the valid choices):

=====================  ==============  ===================================================
scenario               guarantee       pipeline
=====================  ==============  ===================================================
spark-naive            at_least_once   INSERT each row: a replayed batch is duplicated
spark-idempotent       exactly_once    upsert by record id: a replay rewrites the same rows
spark-transactional    exactly_once    rows + offsets in one DB transaction, optimistic
                                       offset check, restart from the DB's offsets
spark-kafka-sink       at_least_once   Spark's Kafka sink, the output topic as written
spark-kafka-sink       exactly_once    the same, audited after a downstream dedupe by id
spark-running-count    exactly_once    running count in Spark's state store, upserted
spark-running-count    at_least_once   per-batch counts added to the table (replay adds twice)
spark-delta            exactly_once    a Delta table, one commit per batch with txnAppId +
                                       txnVersion=batch id: Delta skips a replayed batch
spark-delta            at_least_once   the same table, plain appends: a replay is appended
=====================  ==============  ===================================================
"""
from __future__ import annotations

import math
import shutil
import tempfile
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from labkit import data, topics
from labkit.audit import AuditReport
from labkit.spark import check, delta
from labkit.spark.db import default_url
from labkit.spark.runner import SPARK_CRASH_POINTS, Run, StreamJob, recount, run_until_done
from labkit.spark.sinks import DELTA_KINDS, SinkSpec

PIPELINES: dict[str, dict[str, str]] = {  # scenario -> guarantee -> sink kind
    "spark-naive": {"at_least_once": "naive"},
    "spark-idempotent": {"exactly_once": "idempotent"},
    "spark-transactional": {"exactly_once": "transactional"},
    "spark-kafka-sink": {"at_least_once": "kafka", "exactly_once": "kafka"},
    "spark-running-count": {"exactly_once": "running-count", "at_least_once": "increment-count"},
    "spark-delta": {"exactly_once": "delta", "at_least_once": "delta-append"},
}
BATCHES = 3
CRASH_HIT = 2  # the crash hits the 2nd micro-batch: one committed batch before, one after
PARTITIONS = 2


@dataclass
class SparkExperiment:
    """Everything one scenario run left behind, for notebooks to show."""

    report: AuditReport
    run: Run
    job: StreamJob
    workdir: Path
    inputs: list[dict]  # the generated input records, in order
    output: pd.DataFrame  # the audited view: rows, topic records or counts per key

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def validate(name: str, guarantee: str, crash_at: str | None, records: int) -> str:
    """The sink kind for (scenario, guarantee); ValueError naming the valid choices."""
    if name not in PIPELINES:
        raise ValueError(f"unknown Spark scenario {name!r}; valid: {', '.join(PIPELINES)}")
    valid = PIPELINES[name]
    if guarantee not in valid:
        raise ValueError(f"{name} runs with guarantee {' or '.join(valid)}, not {guarantee!r}")
    if crash_at is not None and crash_at not in SPARK_CRASH_POINTS:
        raise ValueError(f"{name} can crash at {', '.join(SPARK_CRASH_POINTS)} (or nowhere), "
                         f"not at {crash_at!r}")
    if records < BATCHES:
        raise ValueError(f"records must be at least {BATCHES} (the input is read in "
                         f"{BATCHES} micro-batches), not {records}")
    return valid[guarantee]


def experiment(name: str, bootstrap: str, guarantee: str, crash_at: str | None = None,
               records: int = 60, *, workdir: str | Path | None = None,
               resume: str | None = None,
               on_event: Callable[[dict], None] | None = None,
               watch: Callable[[dict[str, str]], AbstractContextManager] | None = None,
               spare: bool = True) -> SparkExperiment:
    """Run scenario ``name`` and audit it; keeps the checkpoint and database in ``workdir``.

    ``resume`` overrides where a restart starts: the transactional sink resumes from the
    offsets in its database by default; ``resume="checkpoint"`` makes Spark replay the
    uncommitted batch instead, so the sink's optimistic offset check has to skip it.
    ``on_event`` sees every batch event (e.g. ``labkit.spark.view.live_log``); ``watch(topics)``
    gets the topic names ({"input", and "output" for the Kafka sink}) and its context is held
    while the query runs (e.g. ``lambda t: Dashboard(bootstrap, t["output"])``).
    ``spare=False`` for the last crash experiment of a series: no spare Spark worker is
    started for a next one.
    """
    kind = validate(name, guarantee, crash_at, records)
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"labkit-{name}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    topic, out_topic = f"{name}-{run_id}-in", f"{name}-{run_id}-out"
    inputs = data.generate(records, seed=0)
    data.load_into_topic(bootstrap, topic, inputs, partitions=PARTITIONS)
    if kind == "kafka":
        topics.create(bootstrap, out_topic, partitions=1)
    sink = SinkSpec(kind, db_url=None if kind in ("kafka", *DELTA_KINDS) else default_url(workdir),
                    table=f"{kind.replace('-', '_')}_{run_id}",
                    output_topic=out_topic if kind == "kafka" else None,
                    path=str(workdir / "delta-table") if kind in DELTA_KINDS else None)
    job = StreamJob(query=name, topic=topic, bootstrap=bootstrap,
                    checkpoint=str(workdir / "checkpoint"), sink=sink,
                    max_offsets_per_trigger=math.ceil(records / BATCHES))
    names = {"input": topic, **({"output": out_topic} if kind == "kafka" else {})}
    with watch(names) if watch else nullcontext():
        run = run_until_done(job, crash_at, CRASH_HIT, log_dir=workdir, on_event=on_event,
                             spare=spare, resume=resume or (
                                 "database" if kind == "transactional" else "checkpoint"))
    expected = recount(bootstrap, topic)  # ground truth: a batch query over the same input
    if kind in ("running-count", "increment-count"):
        counts = check.table_counts(sink.db_url, sink.table)
        output = pd.DataFrame(sorted(counts.items()), columns=["key", "total"])
        report = check.audit_counts(name, guarantee, crash_at, len(inputs), expected, counts)
    else:
        if kind == "kafka":
            output = check.topic_records(bootstrap, out_topic)
            if guarantee == "exactly_once":
                output = check.dedupe_by_id(output)
        elif kind in DELTA_KINDS:  # read back by Spark, in the order of the table's commits
            output, _ = delta.read_table(sink.path)
        else:
            output = check.table_records(sink.db_url, sink.table)
        report = check.audit_output(name, guarantee, crash_at, inputs, output, expected)
    return SparkExperiment(report, run, job, workdir, inputs, output)


def _scenario(name: str) -> Callable[..., AuditReport]:
    def run(bootstrap: str, guarantee: str, crash_at: str | None, records: int) -> AuditReport:
        exp = experiment(name, bootstrap, guarantee, crash_at, records)
        exp.cleanup()
        return exp.report

    run.__name__ = name.replace("-", "_")
    run.__doc__ = f"Scenario {name}: guarantees {', '.join(PIPELINES[name])}."
    return run


SPARK_SCENARIOS: dict[str, Callable[..., AuditReport]] = {name: _scenario(name) for name in PIPELINES}
