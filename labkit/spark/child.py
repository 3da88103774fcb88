"""The Spark worker process: its own SparkSession, running jobs sent by the runner.

Started by ``labkit.spark.runner`` as ``python -m labkit.spark.child JOBS_FD REPLIES_FD TAG``.
It reads one JSON job per line from JOBS_FD and answers with JSON event lines on REPLIES_FD
(stdout/stderr belong to Spark's logging). Jobs:

- ``stream``: a Structured Streaming query, Kafka source -> foreachBatch sink, run with
  ``trigger(availableNow=True)`` until everything present at start is processed (the lab's
  query, or a learner's function that builds and starts it: ``query_code``);
- ``copy``: a learner's Kafka-to-Kafka query (Spark's Kafka sink, any trigger, real-time
  mode included) left running until the lab asks it to stop; the lab kills this worker from
  outside to crash it (``labkit.spark.realtime``);
- ``recount``: the batch recomputation (``spark.read.format("kafka")``) of counts per key;

Both take ``source_options``, extra Kafka source options (``kafka.isolation.level``).
- ``exit``.

A job may carry ``arm`` (the variables of ``labkit.faults.crashpoints.arm``), put into this
process's environment before the job runs: the armed crash point SIGKILLs this process. Its JVM is its child, reading the gateway pipe on stdin; when this process dies the
pipe closes and the JVM exits (PythonGatewayServer exits on EOF), so no JVM is orphaned.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

from labkit import settings

from labkit.kafka import javaconfig, names
from labkit.faults.crashpoints import crash_point
from labkit.spark import checkpoint as ckpt
from labkit.spark.sinks import STATEFUL_KINDS, SinkSpec, with_task_failure, write_batch
from labkit.spark import delta


class _CommitWatcher:
    """Fires ``spark-after-commit`` the moment ``commits/N`` appears.

    Spark writes commits/N after foreachBatch returns, on its own thread, so the crash must
    come from a watcher. The next batch's foreachBatch waits for the watcher, so a crash
    after commit N never lets batch N+1 reach the sink (deterministic outcomes).
    """

    def __init__(self, checkpoint: str):
        self.checkpoint = Path(checkpoint)
        self.thread: threading.Thread | None = None
        self.cancelled = threading.Event()

    def watch(self, batch_id: int) -> None:
        if settings.current().crash_at != "spark-after-commit":
            return
        commit = self.checkpoint / "commits" / str(batch_id)

        def run() -> None:
            while not commit.exists():
                if self.cancelled.wait(0.002):
                    return
            crash_point("spark-after-commit")

        self.thread = threading.Thread(target=run, daemon=True, name="commit-watcher")
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None


def _batch_ranges(job: dict, batch_id: int) -> dict[tuple[str, int], tuple[int, int]]:
    """Spark's own offset range of each partition in this batch, from the checkpoint's
    ``offsets/`` log (written before the batch runs): (topic, partition) -> (start, end).

    Not the rows' first and last offsets: transaction markers and aborted records take
    offsets that no row shows, so a batch's rows need not be consecutive nor reach its end.
    """
    frame = ckpt.batches(job["checkpoint"], ckpt.starting_positions(job["starting_offsets"]))
    mine = frame[frame["batch_id"] == batch_id]
    return {(t, int(p)): (int(b), int(e)) for t, p, b, e in
            mine[["topic", "partition", "start_offset", "end_offset"]].itertuples(index=False)}


def _learner_sink(job: dict, spec: SinkSpec):
    """The learner's foreachBatch function (job["sink_code"]) as the batch writer, called
    with what it names of: batch_df, batch_id, db_url, table, path, app_id, output_topic,
    kafka_options. Spark gives a real foreachBatch function the first two; the others are
    settings a real sink has too. Never the batch's offset ranges: they are in Spark's
    checkpoint files, not given to a sink. None when the job uses the lab's own sink."""
    if not job.get("sink_code"):
        return None
    from labkit.pipelines import learner

    target = learner.load(job["sink_code"]["code"], job["sink_code"]["function"])
    settings = {"db_url": spec.db_url, "table": spec.table, "path": spec.path,
                "app_id": delta.app_id(spec.table), "output_topic": spec.output_topic,
                "kafka_options": javaconfig.spark_options(job["bootstrap"])}

    def write(df, batch_id: int, rows: int) -> dict:
        before = delta.latest_version(spec.path) if spec.path else None
        provided = {"batch_df": df, "batch_id": batch_id, **settings}
        assert provided.keys() == SINK_PROVIDES  # what scenarios.check_sink checks it for
        learner.call(target, **provided)
        if spec.path:  # a Delta table: the notes of the lab's own Delta sink
            return delta.commit_notes(spec.path, before, batch_id, rows)
        return {"written": rows}

    return write


# What a learner's foreachBatch sink may name: Spark's two arguments and the sink's settings.
SINK_PROVIDES = frozenset({"batch_df", "batch_id", "db_url", "table", "path", "app_id",
                           "output_topic", "kafka_options"})
# The columns the lab's sinks and audit read from each micro-batch (a learner's query too)
ROW_COLUMNS = ("id", "key", "value", "topic", "partition", "offset")
# What a learner's functions may name, and so what this worker passes them: the query that
# builds and starts the stream, and the transform of each batch's rows (scenarios and replay
# check a learner's function against these before any Spark starts).
QUERY_PROVIDES = frozenset({"spark", "kafka_options", "input_topic", "checkpoint",
                            "starting_offsets", "sink"})
TRANSFORM_PROVIDES = frozenset({"rows", "threshold_table"})
# A learner's query left running (a trigger other than availableNow) is stopped after this.
LEARNER_QUERY_BOUND_S = 180.0
# What a learner's Kafka-to-Kafka query may name (labkit.spark.realtime checks it too).
COPY_PROVIDES = frozenset({"spark", "kafka_options", "input_topic", "output_topic", "checkpoint"})
HEARTBEAT_S = 1.0  # a copy job's "running" events: the lab's watchdog sees it alive


def _lab_query(spark, job: dict, stateful: bool, each_batch):
    """The lab's own query: the Kafka source, the payment columns, ``foreachBatch``."""
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("kafka")
              .options(**javaconfig.spark_options(job["bootstrap"]))  # + LABKIT_KAFKA_CONFIG
              .option("subscribe", job["topic"])
              # Spark's own group id prefix, in the learner's namespace (labkit.kafka.names): a
              # room's prefixed group ACLs cover it; unchanged without a namespace
              .option("groupIdPrefix", names.group("spark-kafka-source"))
              .option("startingOffsets", job["starting_offsets"])
              .option("maxOffsetsPerTrigger", str(job["max_offsets_per_trigger"])))
    for key, value in job.get("source_options", {}).items():  # e.g. kafka.isolation.level
        reader = reader.option(key, value)
    raw = reader.load()
    records = raw.select(F.get_json_object(F.col("value").cast("string"), "$.id").alias("id"),
                         F.col("key").cast("string").alias("key"),
                         F.col("value").cast("string").alias("value"),
                         "topic", "partition", "offset")
    frame = records.groupBy("key").count() if stateful else records
    return (frame.writeStream.queryName(job["query"])
            .option("checkpointLocation", job["checkpoint"])
            .outputMode("update" if stateful else "append")
            .trigger(availableNow=True)
            .foreachBatch(each_batch)
            .start())


def _learner_source_options(job: dict) -> dict[str, str]:
    """The Kafka options a learner's query gets: the lab's, and Spark's group id prefix in
    the learner's namespace (a room's group ACLs cover it)."""
    return {**javaconfig.spark_options(job["bootstrap"]),
            "groupIdPrefix": names.group("spark-kafka-source")}


def _start_learner_query(job: dict, provided: dict):
    """Call the learner's query function (job["query_code"]) with what it names of
    ``provided``; the started StreamingQuery it must return."""
    from pyspark.sql.streaming import StreamingQuery

    from labkit.pipelines import learner

    code = job["query_code"]
    query = learner.call(learner.load(code["code"], code["function"]), **provided)
    if not isinstance(query, StreamingQuery):
        raise learner.LearnerCodeError(
            f"{code['function']}() returned {type(query).__name__}, not a started query: end "
            "it with .start() and return what that gives")
    return query


def _learner_query(spark, job: dict, each_batch):
    """The learner's query function, called with what it names of: spark, kafka_options,
    input_topic, checkpoint, starting_offsets, sink (the lab's foreachBatch: the learner's
    or the scenario's sink, with the crash points around it)."""
    provided = {"spark": spark, "kafka_options": _learner_source_options(job),
                "input_topic": job["topic"], "checkpoint": job["checkpoint"],
                "starting_offsets": job["starting_offsets"], "sink": each_batch}
    assert provided.keys() == QUERY_PROVIDES  # what scenarios.check_options checks the query for
    return _start_learner_query(job, provided)


def _lookup_transform(job: dict):
    """What each batch's rows go through when processed, with the lookup table: the learner's
    transform (job["transform_code"]) or the lab's ``apply_threshold``."""
    from labkit.pipelines import learner
    from labkit.pipelines.lookup import apply_threshold

    code = job.get("transform_code")
    if code is None:
        return lambda rows: apply_threshold(job["lookup"], rows)
    target = learner.load(code["code"], code["function"])

    def learners(rows: list[dict]) -> list[dict]:
        provided = {"rows": rows, "threshold_table": job["lookup"]}
        assert provided.keys() == TRANSFORM_PROVIDES  # what replay.check_transform checks it for
        out = learner.call(target, **provided)
        if not isinstance(out, list) or any(not isinstance(r, dict) for r in out):
            raise learner.LearnerCodeError(
                f"{code['function']}() returned {type(out).__name__}: return the list of rows "
                "(dicts) to write, each with the columns it was given")
        return out

    return learners


def run_stream(spark, job: dict, send) -> dict:
    spec = SinkSpec(**job["sink"])
    sink = _learner_sink(job, spec)
    stateful = spec.kind in STATEFUL_KINDS
    transform = _lookup_transform(job) if job.get("lookup") else None
    watcher = _CommitWatcher(job["checkpoint"])
    seen: list[int] = []
    t0 = time.monotonic()

    def each_batch(df, batch_id: int) -> None:
        watcher.wait()  # hold this batch until the previous batch's commit watch is over
        if not stateful and (missing := [c for c in ROW_COLUMNS if c not in df.columns]):
            from labkit.pipelines.learner import LearnerCodeError

            raise LearnerCodeError(f"the query's rows lack {missing}: the sinks and the audit "
                                   f"read {', '.join(ROW_COLUMNS)} (it has {df.columns})")
        started = time.monotonic()
        order = ["key"] if stateful else ["partition", "offset"]
        # The lab collects the batch and the sink reads it again: cached, Kafka is read once
        # per batch, as Spark's guide advises for a foreachBatch that uses its DataFrame twice.
        df = df.persist()
        rows = [r.asDict() for r in df.orderBy(*order).collect()]
        if transform is not None:  # the non-deterministic transform (labkit.spark.replay)
            rows = transform(rows)
        send({"event": "batch-start", "batch": batch_id, "rows": len(rows),
              "t": round(started - t0, 3)})
        written = df
        if spec.kind == "kafka":  # in the armed batch one task fails once, under either sink
            written = with_task_failure(df, rows, str(Path(job["checkpoint"]).parent /
                                                      f"task-failed-{uuid.uuid4().hex}"))
        notes = (sink(written, batch_id, len(rows)) if sink else  # the lab's reads the ranges
                 write_batch(spec, written, rows, batch_id, job["bootstrap"],
                             ranges=_batch_ranges(job, batch_id)))
        df.unpersist()
        seen.append(batch_id)
        send({"event": "batch-end", "batch": batch_id, "rows": len(rows),
              "seconds": round(time.monotonic() - started, 3), **notes})
        crash_point("spark-after-sink-before-commit")
        watcher.watch(batch_id)

    learners = bool(job.get("query_code"))
    query = (_learner_query(spark, job, each_batch) if learners
             else _lab_query(spark, job, stateful, each_batch))
    try:
        if learners:  # bounded: a learner's trigger may never end by itself
            if not query.awaitTermination(LEARNER_QUERY_BOUND_S):
                query.stop()
                raise RuntimeError(
                    f"the query was still running after {LEARNER_QUERY_BOUND_S:.0f} s: the lab "
                    "waits for it to end, so give it .trigger(availableNow=True) (everything "
                    "there at the start, then stop)")
        else:
            query.awaitTermination()
    except BaseException:
        watcher.cancelled.set()
        raise
    watcher.wait()
    return {"batches": seen, "seconds": round(time.monotonic() - t0, 3)}


def run_copy(spark, job: dict, send) -> dict:
    """The learner's Kafka-to-Kafka query (job["query_code"]), called with what it names of
    spark, kafka_options, input_topic, output_topic, checkpoint, and left running until the
    file job["stop_file"] exists. Its trigger is the learner's (real-time mode runs until
    stopped), so it is bounded by LEARNER_QUERY_BOUND_S; a query that fails says why."""
    provided = {"spark": spark, "kafka_options": _learner_source_options(job),
                "input_topic": job["topic"], "output_topic": job["output_topic"],
                "checkpoint": job["checkpoint"]}
    assert provided.keys() == COPY_PROVIDES  # what realtime.check_query checks the query for
    query = _start_learner_query(job, provided)
    try:  # the trigger as Spark applied it, e.g. RealTimeTrigger(5000) (an internal name)
        trigger = str(query._jsq.streamingQuery().trigger())
    except Exception:  # noqa: BLE001 - only a label
        trigger = "unknown"
    started = time.monotonic()
    send({"event": "started", "trigger": trigger})
    stop, beat = Path(job["stop_file"]), started
    try:
        while not stop.exists():
            if not query.isActive:
                raise RuntimeError(f"the query stopped by itself: {query.exception()}")
            if time.monotonic() - started > LEARNER_QUERY_BOUND_S:
                raise RuntimeError(f"the query ran for {LEARNER_QUERY_BOUND_S:.0f} s without "
                                   "being asked to stop")
            if time.monotonic() - beat >= HEARTBEAT_S:
                beat = time.monotonic()
                send({"event": "running", "t": round(beat - started, 1)})
            time.sleep(0.05)
    finally:
        query.stop()
    return {"seconds": round(time.monotonic() - started, 3)}


def recount(spark, job: dict, send) -> dict:
    """Counts per key of the whole topic, by a batch query: the ground truth for a stream."""
    reader = (spark.read.format("kafka")
              .options(**javaconfig.spark_options(job["bootstrap"]))  # + LABKIT_KAFKA_CONFIG
              .option("subscribe", job["topic"])
              .option("groupIdPrefix", names.group("spark-kafka-relation"))  # as the stream's
              .option("startingOffsets", "earliest").option("endingOffsets", "latest"))
    for key, value in job.get("source_options", {}).items():  # the stream's isolation too
        reader = reader.option(key, value)
    df = reader.load()
    rows = df.selectExpr("CAST(key AS STRING) AS key").groupBy("key").count().collect()
    return {"counts": {r["key"]: int(r["count"]) for r in rows}}


JOBS = {"stream": run_stream, "copy": run_copy, "recount": recount, "delta-read": delta.read_job}


def main(argv: list[str]) -> None:
    jobs_fd, replies_fd, tag = int(argv[0]), int(argv[1]), argv[2]
    replies = os.fdopen(replies_fd, "w", buffering=1)
    lock = threading.Lock()

    def send(message: dict) -> None:
        with lock:
            replies.write(json.dumps(message) + "\n")

    started = time.monotonic()
    from labkit.spark.session import session

    # The tag in the JVM's command line lets the runner (and pgrep) find this worker's JVM.
    # Workers are short-lived with tiny batches: the C1-only JIT and the serial GC start
    # faster and use fewer threads than the defaults (about 15% faster per crash run here).
    java_opts = settings.current().spark_java_opts  # default: C1 only, serial GC
    # local=True even with LABKIT_SPARK_REMOTE: the crash points SIGKILL this driver, and a
    # Connect server would run foreachBatch in a process of its own, where nothing is armed.
    spark = session("labkit-spark-worker", java_options=f"-Dlabkit.worker={tag} {java_opts}",
                    local=True)
    send({"event": "ready", "pid": os.getpid(),
          "jvm_pid": int(spark._jvm.java.lang.ProcessHandle.current().pid()),
          "startup_s": round(time.monotonic() - started, 3)})
    with os.fdopen(jobs_fd) as jobs:
        for line in jobs:
            job = json.loads(line)
            if job["op"] == "exit":
                break
            # the lab's LABKIT_KAFKA_CONFIG and LABKIT_NAMESPACE as they are now, not at start
            settings.apply_connection_env(job.get("env", {}))
            os.environ.update(job.get("arm", {}))  # crash points read these when visited
            try:
                result = JOBS[job["op"]](spark, job, send)
            except Exception as exc:  # report and stay alive for the next job
                send({"event": "error", "type": type(exc).__name__, "message": str(exc)[:4000]})
            else:
                send({"event": "done", "result": result})
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
