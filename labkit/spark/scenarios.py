"""Spark scenarios (``labkit.experiments.spark`` composes and registers them): one streaming
query (``labkit.spark.clients.SparkQuery``), one crash (``CrashAt``), one audit
(``labkit.spark.check.SinkAudit``). Here: which sink each scenario runs, its job, its checks.

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
                                       batch-id sink (rows + batch id in one transaction,
                                       a recorded batch id skipped)
spark-txn-input-       exactly_once    the same input and sink with Spark's default
default                                isolation (read_uncommitted): aborted records read
=====================  ==============  ===================================================

The crash point ``spark-task-first-attempt`` (spark-kafka-sink only) is not a driver crash:
one task of the 2nd micro-batch's Kafka write (the lab's sink's, or a learner's
``pipeline=``) fails once after sending half its rows, and Spark's retry sends them again
(local[2,4] allows 4 attempts per task).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit.kafka import topics
from labkit.kafka.inspect import describe_topic
from labkit.pipelines import learner
from labkit.storage.db import default_url
from labkit.spark.child import QUERY_PROVIDES, SINK_PROVIDES
from labkit.spark.runner import SPARK_CRASH_POINTS, StreamJob
from labkit.spark.sinks import DELTA_KINDS, STATEFUL_KINDS, TASK_FAILURE, SinkSpec

PIPELINES: dict[str, dict[str, str]] = {  # scenario -> guarantee -> sink kind
    "spark-naive": {"at_least_once": "naive"},
    "spark-idempotent": {"exactly_once": "idempotent"},
    "spark-transactional": {"exactly_once": "transactional"},
    "spark-kafka-sink": {"at_least_once": "kafka", "exactly_once": "kafka"},
    "spark-running-count": {"exactly_once": "running-count", "at_least_once": "increment-count"},
    "spark-delta": {"exactly_once": "delta", "at_least_once": "delta-append"},
    "spark-txn-input": {"exactly_once": "batch-id"},
    "spark-txn-input-default": {"exactly_once": "batch-id"},
}
# Scenarios whose input is written by the lab's exactly-once producer (labkit.pipelines.txn)
# in transactions of TXN_SIZE records, every ABORT_EVERY-th aborted; -> Kafka source options.
TXN_INPUT: dict[str, dict[str, str]] = {
    "spark-txn-input": {"kafka.isolation.level": "read_committed"},
    "spark-txn-input-default": {},  # Spark's source keeps the Java client's read_uncommitted
}
TXN_SIZE, ABORT_EVERY = 5, 3
BATCHES = 3
CRASH_HIT = 2  # the crash hits the 2nd micro-batch: one committed batch before, one after
PARTITIONS = 2


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


def check_options(name: str, guarantee: str, crash_at: str | None, records: int,
                  query: Callable | None = None, source_options: dict | None = None,
                  **_: Any) -> None:
    """The scenario's options together, before anything starts: ``validate``, and a
    learner's ``query`` (what it names; it sets its own source options; the running count
    keeps the lab's query)."""
    kind = validate(name, guarantee, crash_at, records)
    if query is None:
        return
    if kind in STATEFUL_KINDS:
        raise ValueError(f"{name} counts per key with the lab's own query; run it without "
                         "query=")
    learner.check_parameters(query, QUERY_PROVIDES)
    if source_options:
        raise ValueError("with query= the Kafka source's options are your query's: set "
                         "them there (.option(...)), not in source_options")


def check_sink(sink: Callable, o: Any) -> None:
    """A learner's ``foreachBatch`` sink (``pipeline=``) replaces the lab's (a task failure
    breaks whichever writes the batch: ``sinks.with_task_failure``); its cell's text must
    be readable, and it names only what the worker passes (``SINK_PROVIDES``)."""
    learner.code_of(sink)
    learner.check_parameters(sink, SINK_PROVIDES)


def _code(function: Callable | None) -> dict[str, str] | None:
    """A learner's function as the worker runs it: the text of its cell, and its name."""
    if function is None:
        return None
    return {"code": learner.code_of(function), "function": function.__name__}


def stream_job(name: str, o: Any, run: Any, workdir: Path) -> StreamJob:
    """Scenario ``name``'s query over the run's input topic (``o``: its options): its sink
    (a table in ``workdir``'s database, a Delta table there, or the run's output topic), its
    checkpoint in ``workdir``, three micro-batches, the learner's sink (``run.pipeline``)
    or query (``o.query``) where given.

    A learner's ``foreachBatch`` sink, written in a notebook cell, runs in the Spark worker
    instead of the scenario's own (the crash points stay where the worker and the function
    put them; the tables, the replay and the audit are the scenario's). It names what it
    needs among batch_df, batch_id, db_url, table, path, app_id, output_topic and
    kafka_options (what a real foreachBatch function has). A learner's query builds and
    starts the Structured Streaming query (``spark.readStream.format("kafka")`` ...
    ``.foreachBatch(sink).start()``) in place of the lab's: it names what it needs among
    spark, kafka_options, input_topic, checkpoint, starting_offsets and sink (the lab's
    foreachBatch: the crash points, the events, and the learner's or the scenario's sink);
    its rows keep the columns id, key, value, topic, partition, offset, which the sinks and
    the audit read."""
    kind = PIPELINES[name][o.guarantee]
    topic = run.topics["input"]
    if o.query is not None:  # the learner's query sets its own source options, on screen
        source_options: dict[str, str] = {}
    else:
        source_options = TXN_INPUT.get(name, {}) if o.source_options is None else o.source_options
    # Markers and aborted records take offsets too: split the offsets, not the records.
    span = sum(p.high_watermark for p in describe_topic(run.bootstrap, topic).partitions)
    spec = SinkSpec(kind, db_url=None if kind in ("kafka", *DELTA_KINDS) else default_url(workdir),
                    table=f"{kind.replace('-', '_')}_{run.run_id}",
                    output_topic=run.topics.get("output") if kind == "kafka" else None,
                    path=str(workdir / "delta-table") if kind in DELTA_KINDS else None)
    return StreamJob(query=name, topic=topic, bootstrap=run.bootstrap,
                     checkpoint=str(workdir / "checkpoint"), sink=spec,
                     max_offsets_per_trigger=math.ceil(span / BATCHES),
                     source_options=dict(source_options), sink_code=_code(run.pipeline),
                     query_code=_code(o.query))


def resume(name: str, o: Any) -> str:
    """Where a restart starts: the transactional sink resumes from the offsets in its
    database; ``o.resume="checkpoint"`` makes Spark replay the uncommitted batch instead,
    so the sink's optimistic offset check has to skip it."""
    return o.resume or ("database" if PIPELINES[name][o.guarantee] == "transactional"
                        else "checkpoint")


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
