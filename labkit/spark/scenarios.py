"""Spark scenarios (``labkit.experiments.spark`` registers them as experiments): one streaming
query, one crash, one audit.

The input is ``records`` generated records (labkit.pipelines.data, seed 0) on a 2-partition topic, read
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
spark-txn-input        exactly_once    input written in transactions, some aborted; read
                                       with kafka.isolation.level=read_committed into the
                                       transactional sink (Spark's offset ranges stored)
spark-txn-input-       exactly_once    the same input and sink with Spark's default
default                                isolation (read_uncommitted): aborted records read
=====================  ==============  ===================================================

The crash point ``spark-task-first-attempt`` (spark-kafka-sink only) is not a driver crash:
one task of the 2nd micro-batch's Kafka write fails once after sending half its rows, and
Spark's retry sends them again (local[2,4] allows 4 attempts per task).
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

from labkit.kafka import names, topics

from labkit.pipelines import data
from labkit.checking.audit import AuditReport
from labkit.kafka.inspect import describe_topic
from labkit.pipelines import learner
from labkit.spark import check, tables
from labkit.storage.db import default_url
from labkit.spark.child import QUERY_PROVIDES
from labkit.spark.runner import SPARK_CRASH_POINTS, StreamJob, recount
from labkit.spark.supervised import Run, run_until_done
from labkit.spark.sinks import DELTA_KINDS, STATEFUL_KINDS, SinkSpec

PIPELINES: dict[str, dict[str, str]] = {  # scenario -> guarantee -> sink kind
    "spark-naive": {"at_least_once": "naive"},
    "spark-idempotent": {"exactly_once": "idempotent"},
    "spark-transactional": {"exactly_once": "transactional"},
    "spark-kafka-sink": {"at_least_once": "kafka", "exactly_once": "kafka"},
    "spark-running-count": {"exactly_once": "running-count", "at_least_once": "increment-count"},
    "spark-delta": {"exactly_once": "delta", "at_least_once": "delta-append"},
    "spark-txn-input": {"exactly_once": "transactional"},
    "spark-txn-input-default": {"exactly_once": "transactional"},
}
# Scenarios whose input is written by the lab's exactly-once producer (labkit.pipelines.txn)
# in transactions of TXN_SIZE records, every ABORT_EVERY-th aborted; -> Kafka source options.
TXN_INPUT: dict[str, dict[str, str]] = {
    "spark-txn-input": {"kafka.isolation.level": "read_committed"},
    "spark-txn-input-default": {},  # Spark's source keeps the Java client's read_uncommitted
}
TXN_SIZE, ABORT_EVERY = 5, 3
TASK_FAILURE = "spark-task-first-attempt"  # only the Kafka sink has executor-side writes
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

    @property
    def topics(self) -> dict[str, str]:
        """The run's topics by role, the broker's names (the learner's namespace included)."""
        return {"input": self.job.topic,
                **({"output": self.job.sink.output_topic} if self.job.sink.output_topic else {})}

    @property
    def history(self) -> list[dict]:
        """Every attempt's batch events, in order (``attempt`` says whose)."""
        return [{**e, "attempt": a.number} for a in self.run.attempts for e in a.events]

    def summary(self) -> str:
        return self.report.summary()

    def to_json(self) -> str:
        return self.report.to_json()

    def timeline(self) -> str:
        """One line per micro-batch per attempt: its rows, outcome and whether it replayed."""
        return self.run.timeline.to_string(index=False)

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    def delete_topics(self) -> None:
        """Delete the run's input (and output) topic: ``labkit scenario`` does at the end."""
        topics.delete(self.job.bootstrap, *self.topic_names())

    def topic_names(self) -> list[str]:
        """The run's topics, the broker's names (the learner's namespace included)."""
        return [self.job.topic, *([self.job.sink.output_topic] if self.job.sink.output_topic
                                  else [])]


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
    if crash_at == TASK_FAILURE and valid[guarantee] != "kafka":
        raise ValueError(f"{TASK_FAILURE} fails a task of the Kafka sink's write: use it with "
                         f"spark-kafka-sink, not {name}")
    if records < BATCHES:
        raise ValueError(f"records must be at least {BATCHES} (the input is read in "
                         f"{BATCHES} micro-batches), not {records}")
    return valid[guarantee]


def experiment(name: str, bootstrap: str, guarantee: str, crash_at: str | None = None,
               records: int = 60, *, workdir: str | Path | None = None,
               resume: str | None = None,
               on_event: Callable[[dict], None] | None = None,
               watch: Callable[[dict[str, str]], AbstractContextManager] | None = None,
               spare: bool = True,
               source_options: dict[str, str] | None = None,
               sink: Callable | None = None,
               query: Callable | None = None) -> SparkExperiment:
    """Run scenario ``name`` and audit it; keeps the checkpoint and database in ``workdir``.

    ``resume`` overrides where a restart starts: the transactional sink resumes from the
    offsets in its database by default; ``resume="checkpoint"`` makes Spark replay the
    uncommitted batch instead, so the sink's optimistic offset check has to skip it.
    ``on_event`` sees every batch event (e.g. ``labkit.spark.view.live_log``); ``watch(topics)``
    gets the topic names ({"input", and "output" for the Kafka sink}) and its context is held
    while the query runs (e.g. ``lambda t: Dashboard(bootstrap, t["output"])``).
    ``spare=False`` for the last crash experiment of a series: no spare Spark worker is
    started for a next one. ``source_options`` replaces the scenario's Kafka source options
    (e.g. a learner's attempt at reading a transactional input).

    ``sink`` is a learner's ``foreachBatch`` function, written in a notebook cell: the Spark
    worker runs the text of that cell instead of the scenario's own sink (the crash points
    stay where the worker and the function put them; the tables, the replay and the audit
    are the scenario's). It names what it needs among batch_df, batch_id, db_url, table,
    path, app_id, output_topic, kafka_options and ranges.

    ``query`` is a learner's function that builds and starts the Structured Streaming query
    (``spark.readStream.format("kafka")`` ... ``.foreachBatch(sink).start()``), run by the
    worker in place of the lab's own. It names what it needs among spark, kafka_options,
    input_topic, checkpoint, starting_offsets and sink (the lab's foreachBatch: the crash
    points, the events, and the learner's or the scenario's sink); its rows must keep the
    columns id, key, value, topic, partition, offset, which the sinks and the audit read.
    """
    kind = validate(name, guarantee, crash_at, records)
    sink_code = None
    if sink is not None:
        if crash_at == TASK_FAILURE:
            raise ValueError(f"{TASK_FAILURE} fails a task of the lab's own Kafka sink: run "
                             "it without sink=")
        sink_code = {"code": learner.code_of(sink), "function": sink.__name__}
    query_code = None
    if query is not None:
        if kind in STATEFUL_KINDS:
            raise ValueError(f"{name} counts per key with the lab's own query; run it without "
                             "query=")
        learner.check_parameters(query, QUERY_PROVIDES)
        query_code = {"code": learner.code_of(query), "function": query.__name__}
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"labkit-{name}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    # In the learner's namespace (labkit.kafka.names): Spark's Kafka source and sink get these names.
    topic, out_topic = names.topic(f"{name}-{run_id}-in"), names.topic(f"{name}-{run_id}-out")
    if query_code is not None:  # the learner's query sets its own source options, on screen
        if source_options:
            raise ValueError("with query= the Kafka source's options are your query's: set "
                             "them there (.option(...)), not in source_options")
        source_options = {}
    elif source_options is None:
        source_options = TXN_INPUT.get(name, {})
    if name in TXN_INPUT:  # only the committed records are input; aborted ones must not show
        inputs, _ = load_transactional(bootstrap, topic, data.generate(records, seed=0))
    else:
        inputs = data.generate(records, seed=0)
        data.load_into_topic(bootstrap, topic, inputs, partitions=PARTITIONS)
    # Markers and aborted records take offsets too: split the offsets, not the records.
    span = sum(p.high_watermark for p in describe_topic(bootstrap, topic).partitions)
    if kind == "kafka":
        topics.create(bootstrap, out_topic, partitions=1)
    spec = SinkSpec(kind, db_url=None if kind in ("kafka", *DELTA_KINDS) else default_url(workdir),
                    table=f"{kind.replace('-', '_')}_{run_id}",
                    output_topic=out_topic if kind == "kafka" else None,
                    path=str(workdir / "delta-table") if kind in DELTA_KINDS else None)
    job = StreamJob(query=name, topic=topic, bootstrap=bootstrap,
                    checkpoint=str(workdir / "checkpoint"), sink=spec,
                    max_offsets_per_trigger=math.ceil(span / BATCHES),
                    source_options=dict(source_options), sink_code=sink_code,
                    query_code=query_code)
    made = {"input": topic, **({"output": out_topic} if kind == "kafka" else {})}
    with watch(made) if watch else nullcontext():
        run = run_until_done(job, crash_at, CRASH_HIT, log_dir=workdir, on_event=on_event,
                             spare=spare, resume=resume or (
                                 "database" if kind == "transactional" else "checkpoint"))
    # Ground truth: a batch query over the same input (read_committed for a transactional
    # input whatever the stream used: aborted records are not part of it).
    expected = recount(bootstrap, topic, source_options=(
        {"kafka.isolation.level": "read_committed"} if name in TXN_INPUT else None))
    if kind in ("running-count", "increment-count"):
        counts = check.table_counts(spec.db_url, spec.table)
        output = pd.DataFrame(sorted(counts.items()), columns=["key", "total"])
        report = check.audit_counts(name, guarantee, crash_at, len(inputs), expected, counts)
    else:
        if kind == "kafka":
            output = check.topic_records(bootstrap, out_topic)
            if guarantee == "exactly_once":
                output = check.dedupe_by_id(output)
        elif kind in DELTA_KINDS:  # read back by Spark, in the order of the table's commits
            output, _ = tables.read_table(spec.path)
        else:
            output = check.table_records(spec.db_url, spec.table)
        aborted = check.aborted_rows(bootstrap, topic, output) if name in TXN_INPUT else None
        report = check.audit_output(name, guarantee, crash_at, inputs, output, expected,
                                    aborted=aborted)
    return SparkExperiment(report, run, job, workdir, inputs, output)


def load_transactional(bootstrap: str, topic: str, records: list[dict],
                       partitions: int = PARTITIONS, txn_size: int = TXN_SIZE,
                       abort_every: int = ABORT_EVERY) -> tuple[list[dict], list[dict]]:
    """Create ``topic`` and write ``records`` with the lab's exactly-once producer, in
    transactions of ``txn_size`` records (keyed, so spread over the partitions); every
    ``abort_every``-th transaction is aborted. Returns (committed, aborted) records.

    Waits until every partition's last stable offset reaches its high watermark: the
    coordinator writes the markers after it answered, and a reader started before the last
    marker would stop short of the last committed records.
    """
    from labkit.kafka.inspect.client import Inspector
    from labkit.pipelines.guarantee import transactions

    topics.create(bootstrap, topic, partitions=partitions)
    txn = transactions(bootstrap, f"{topic}-writer")
    committed, aborted = [], []
    try:
        for number, start in enumerate(range(0, len(records), txn_size), start=1):
            chunk = records[start:start + txn_size]
            txn.begin()
            for r in chunk:
                txn.produce(topic, str(r["key"]), r)
            txn.flush(60)
            if number % abort_every == 0:
                txn.abort()
                aborted += chunk
            else:
                txn.commit()
                committed += chunk
    finally:
        txn.producer.flush(10)
    with Inspector(bootstrap) as inspector:
        inspector.settled_offsets(topic)
    return committed, aborted
