"""A Kafka-to-Kafka query under a driver crash, whatever its trigger: Spark's real-time mode
against a micro-batch, its latency and what one crash writes twice (issue 30).

    run = realtime.experiment(bootstrap, query=copy_query)   # the learner's query, its trigger
    run.report          # the output topic as written: Spark's Kafka sink is at-least-once
    run.deduped         # the same records after a downstream dedupe by payment id
    run.latency         # output CreateTime - input CreateTime, records copied before the kill

A producer writes payments at ``rate`` a second (key: the account, value: the payment with
its id) while the learner's query copies them with Spark's official Kafka source and sink in a
fresh Spark worker. ``kill_after`` seconds after the query's first checkpoint (its first
``commits/`` file) the lab SIGKILLs the worker, Python driver and JVM at once: mid-batch for a
real-time query, whose batch (and so its checkpoint interval) lasts the trigger's duration.
The producer writes until ``after_kill`` seconds after the kill, so the kill always lands in
a stream of payments, however slowly Spark started. The warm shared worker restarts the
query on the same checkpoint; once it has checkpointed the input's end it is stopped, and the
audit reads both topics.
"""
from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from confluent_kafka import Consumer, TopicPartition

from labkit import progress
from labkit.checking.audit import AuditReport, expected_counts
from labkit.kafka import names, topics
from labkit.kafka.clientlog import client_config
from labkit.pipelines import data, learner
from labkit.progress import wait_until
from labkit.spark import check
from labkit.spark.child import COPY_PROVIDES
from labkit.spark.runner import JobResult, SparkJobError, fresh_worker, shared_worker

SCENARIO = "spark-realtime"
PARTITIONS = 2  # one long-running task each in real-time mode: local[2,4] has two slots
START_S = 90.0  # a Spark worker's start and the query's first output, on a busy machine
DONE_S = 120.0  # the restarted query copying the rest


@dataclass
class RealtimeRun:
    report: AuditReport  # the output topic as written
    deduped: AuditReport  # after a downstream dedupe by payment id
    trigger: str  # the trigger Spark applied, by its class name: RealTimeTrigger(5000)
    records: int  # payments written (the input topic read back)
    killed_after_checkpoint_s: float  # how long the killed driver had run since its checkpoint
    rewritten: int  # records the killed driver wrote that its restart wrote again
    latency: dict[str, float]  # p50_ms, p99_ms over the records copied before the kill
    # every output record, as read_stamped gives it, with delay_ms (its CreateTime minus its
    # input's) and copy (1 for a payment's first record, 2 for the next, ...)
    output: pd.DataFrame
    killed_ms: float  # when the driver was SIGKILLed (the machine's clock, as CreateTime)
    topics: dict[str, str] = field(default_factory=dict)
    steps: list[tuple[float, str]] = field(default_factory=list, repr=False)
    history: tuple = ()
    bootstrap: str = ""

    def cleanup(self) -> None:
        """Delete the run's topics (kept for a notebook's next cells)."""
        if self.topics:
            topics.delete(self.bootstrap, *self.topics.values())
            self.topics = {}

    def summary(self) -> str:
        return (f"{self.report.summary()}\ntrigger {self.trigger}: SIGKILL "
                f"{self.killed_after_checkpoint_s:.1f} s after its last checkpoint, "
                f"{self.rewritten} of its records written again; latency p50 "
                f"{self.latency['p50_ms']:.0f} ms, p99 {self.latency['p99_ms']:.0f} ms; "
                f"after a dedupe by id: {self.deduped.verdict}")

    def timeline(self) -> str:
        return "\n".join(f"{t:5.1f} s  {what}" for t, what in self.steps)

    def to_json(self) -> str:
        return json.dumps({**json.loads(self.report.to_json()), "trigger": self.trigger,
                           "killed_after_checkpoint_s": self.killed_after_checkpoint_s,
                           "rewritten": self.rewritten,
                           **self.latency, "deduped_verdict": self.deduped.verdict,
                           "deduped_duplicated": self.deduped.duplicated})


# The lab's own query (the CLI's, and the tests'): the notebook's copy_query, its trigger set
# by ``reference_query``; "micro-batch" leaves Spark's default trigger.
REFERENCE = '''from pyspark.sql import functions as F

def copy_query(spark, kafka_options, input_topic, output_topic, checkpoint):
    payments = (spark.readStream.format("kafka")
                .options(**kafka_options)
                .option("subscribe", input_topic)
                .option("startingOffsets", "earliest")
                .load())
    return (payments.select("key", "value")
            .writeStream.format("kafka")
            .options(**kafka_options)
            .option("topic", output_topic)
            .option("checkpointLocation", checkpoint)
            .outputMode("update")TRIGGER
            .start())
'''
MICRO_BATCH = "micro-batch"


def reference_query(trigger: str) -> Callable:
    """The lab's copy query with ``trigger``: MICRO_BATCH (Spark's default trigger) or a
    real-time batch duration such as "5 seconds" (Spark 4.2 refuses less than 5 s)."""
    line = "" if trigger == MICRO_BATCH else f"\n            .trigger(realTime={trigger!r})"
    name = "copy_query" if trigger == MICRO_BATCH else "realtime_query"
    code = REFERENCE.replace("TRIGGER", line).replace("def copy_query(", f"def {name}(")
    return learner.from_text(code, name, f"<labkit spark-realtime {trigger}>")


def check_query(query: Callable) -> dict[str, str]:
    """The learner's query as the worker runs it (its cell's text), checked before Spark
    starts: it may name only what the worker provides."""
    learner.check_parameters(query, COPY_PROVIDES)
    return {"code": learner.code_of(query), "function": query.__name__}


def check_sizes(rate: float, kill_after: float, after_kill: float) -> None:
    if not 1 <= rate <= 10_000:
        raise ValueError(f"rate must be 1 to 10000 payments a second, not {rate}")
    if kill_after < 0 or after_kill < 0:
        raise ValueError(f"kill_after and after_kill are seconds, 0 or more (given "
                         f"{kill_after}, {after_kill})")


def read_stamped(bootstrap: str, topic: str) -> pd.DataFrame:
    """Every record of ``topic`` (read_committed): partition, offset, id and key (the
    payment's), record_key (the Kafka record's key) and created_ms (its CreateTime)."""
    return pd.DataFrame([(r.partition, r.offset, r.value["id"], r.value["key"], r.key,
                          r.timestamp_ms) for r in topics.read(bootstrap, topic)],
                        columns=["partition", "offset", "id", "key", "record_key", "created_ms"])


def _end(consumer: Consumer, topic: str, partition: int) -> int:
    return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)[1]


def _output_size(consumer: Consumer, topic: str) -> int:
    return sum(_end(consumer, topic, p) for p in range(PARTITIONS))


def _committed_up_to(checkpoint: Path, topic: str) -> dict[int, int]:
    """The input offsets of the query's last committed batch (``offsets/N`` with a
    ``commits/N``; a real-time batch writes both when it ends): partition -> offset."""
    done = [int(f.name) for f in (checkpoint / "commits").glob("[0-9]*")]
    if not done:
        return {}
    try:
        last = (checkpoint / "offsets" / str(max(done))).read_text().splitlines()[-1]
        return {int(p): int(o) for p, o in json.loads(last).get(topic, {}).items()}
    except (OSError, ValueError, IndexError):  # being written: read it on the next poll
        return {}


def _checkpoints(checkpoint: Path) -> list[float]:
    """When each of the query's checkpoints (its commits/N files) was written."""
    return sorted(f.stat().st_mtime for f in (checkpoint / "commits").glob("[0-9]*"))


def _latency(output: pd.DataFrame, since_ms: float, until_ms: float) -> dict[str, float]:
    """p50 and p99 of the delay of each payment's first copy (``_copies``), over payments
    produced after ``since_ms`` (the query's first output: steady state) and copied before
    ``until_ms`` (the kill)."""
    first = output[output["copy"] == 1]
    born = first["created_ms"] - first["delay_ms"]
    delays = sorted(first.loc[(first["created_ms"] < until_ms) & (born > since_ms),
                              "delay_ms"].tolist())
    if len(delays) < 2:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    q = statistics.quantiles(delays, n=100)
    return {"p50_ms": round(q[49], 1), "p99_ms": round(q[98], 1)}


def _copies(inputs: pd.DataFrame, output: pd.DataFrame) -> pd.DataFrame:
    """The output with delay_ms (its CreateTime minus its payment's) and copy (1 for a
    payment's first record, 2 for the next, ...)."""
    born = inputs.drop_duplicates("id").set_index("id")["created_ms"]
    return output.assign(delay_ms=output["created_ms"] - born.reindex(output["id"]).to_numpy(),
                         copy=output.sort_values("created_ms").groupby("id").cumcount() + 1)


class _Driver:
    """A query running in a Spark worker, on a thread of its own so the lab can watch Kafka
    and kill the worker meanwhile."""

    def __init__(self, worker, job: dict, stop_file: Path):
        self.worker, self.stop_file = worker, stop_file
        self.started = threading.Event()
        self.trigger = "unknown"
        self.result: JobResult | None = None
        self.error: BaseException | None = None

        def on_event(event: dict) -> None:
            if event["event"] == "started":
                self.trigger = event.get("trigger", "unknown")
                self.started.set()

        def run() -> None:
            try:
                self.result = worker.run(job, on_event=on_event)
            except BaseException as exc:  # shown by check(), on the lab's thread
                self.error = exc
            finally:
                self.started.set()

        self.thread = threading.Thread(target=run, daemon=True, name="spark-copy")
        self.thread.start()

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.result is not None and self.result.crashed:
            raise SparkJobError("the Spark worker died before it was killed (see its log)")

    def stop(self) -> None:
        """Ask the query to stop; a worker that does not end it within 60 s is killed."""
        self.stop_file.touch()
        self.thread.join(60)
        if self.thread.is_alive():
            self.worker.sigkill()
            self.thread.join(30)
            raise SparkJobError("the query did not stop within 60 s of being asked; its "
                                "worker was killed")
        self.check()


def experiment(bootstrap: str, query: Callable, *, rate: float = 100.0, kill_after: float = 2.5,
               after_kill: float = 1.0, seed: int = 0, spare: bool = False,
               keep_topics: bool = True) -> RealtimeRun:
    """Copy payments, produced at ``rate`` a second, with the learner's ``query``; SIGKILL its
    driver ``kill_after`` s after its first checkpoint, restart it on the same checkpoint,
    stop the payments ``after_kill`` s after the kill, and audit the output as written and
    after a dedupe by payment id."""
    code = check_query(query)
    check_sizes(rate, kill_after, after_kill)
    run = uuid.uuid4().hex[:8]
    source, sink = names.topic(f"spark-rt-{run}-in"), names.topic(f"spark-rt-{run}-out")
    workdir = Path(tempfile.mkdtemp(prefix="labkit-spark-rt-"))
    checkpoint = workdir / "checkpoint"
    job = {"op": "copy", "bootstrap": bootstrap, "topic": source, "output_topic": sink,
           "checkpoint": str(checkpoint), "query_code": code}
    # more than the run can write: it stops at the kill + after_kill
    payments = data.generate(int(rate * (2 * START_S + after_kill)), seed=seed)
    began = time.monotonic()
    steps: list[tuple[float, str]] = []

    def step(what: str) -> None:
        steps.append((round(time.monotonic() - began, 1), what))
        progress.step(what)

    topics.create(bootstrap, source, sink, partitions=PARTITIONS)
    watcher = Consumer(client_config({"bootstrap.servers": bootstrap, "group.id": "labkit-reader"}))
    failed: list[str] = []
    stop_payments = threading.Event()
    producer = threading.Thread(target=data.produce_at_rate, daemon=True, name="payments",
                                args=(bootstrap, source, payments, rate, stop_payments, failed))
    drivers: list[_Driver] = []
    try:
        worker = fresh_worker(spare=spare)
        drivers.append(_Driver(worker, {**job, "stop_file": str(workdir / "stop-1")},
                               workdir / "stop-1"))
        wait_until(lambda: drivers[0].started.is_set(), "the query to start", START_S)
        drivers[0].check()
        step(f"{query.__name__} started in a fresh Spark worker; payments arrive at "
             f"{rate:g} a second")
        producer.start()
        wait_until(lambda: drivers[0].check() or _output_size(watcher, sink) > 0,
                   "the query's first output", START_S)
        first_output_ms = time.time() * 1000
        wait_until(lambda: drivers[0].check() or bool(_checkpoints(checkpoint)),
                   "the query's first checkpoint", START_S)
        first_checkpoint = _checkpoints(checkpoint)[0]
        time.sleep(max(0.0, first_checkpoint + kill_after - time.time()))
        last = _checkpoints(checkpoint)[-1]
        out_at_kill = _output_size(watcher, sink)
        killed_ms = time.time() * 1000
        worker.sigkill()
        drivers[0].thread.join(30)
        since = killed_ms / 1000 - last
        step(f"SIGKILL the driver (Python and JVM) {since:.1f} s after its last checkpoint, "
             f"{out_at_kill} records in the output")
        drivers.append(_Driver(shared_worker(), {**job, "stop_file": str(workdir / "stop-2")},
                               workdir / "stop-2"))
        step("the query restarts on the same checkpoint (a warm worker)")
        stop_payments.wait(max(0.0, killed_ms / 1000 + after_kill - time.time()))
        stop_payments.set()
        producer.join(60)
        ends = {p: _end(watcher, source, p) for p in range(PARTITIONS)}
        wait_until(lambda: drivers[1].check() or _committed_up_to(checkpoint, source) == ends,
                   f"the restarted query to checkpoint the input's end ({sum(ends.values())} "
                   "records)", DONE_S)
        drivers[1].stop()
        step("the restarted query checkpointed the input's end: it is stopped")
        if failed:
            raise RuntimeError(f"the producer failed: {failed[:3]}")
    except BaseException:  # a failed run keeps no topics: nothing in them is worth reading
        stop_payments.set()
        topics.delete(bootstrap, source, sink)
        raise
    finally:  # also on a failure: no query left running, no thread writing
        for driver in drivers:
            if driver.thread.is_alive():
                driver.worker.sigkill()
                driver.thread.join(30)
        watcher.close()
        stop_payments.set()
        if producer.is_alive():
            producer.join(60)
        shutil.rmtree(workdir, ignore_errors=True)
    inputs = read_stamped(bootstrap, source)
    output = read_stamped(bootstrap, sink)
    kept = {"input": source, "output": sink}
    if not keep_topics:
        topics.delete(bootstrap, source, sink)
        kept = {}
    written = set(inputs["id"])  # the payments the input topic holds: what the audit expects
    return _audited([p for p in payments if p["id"] in written], inputs, output,
                    drivers[0].trigger, first_output_ms, killed_ms, since, steps, kept, bootstrap)


def _audited(payments: list[dict], inputs: pd.DataFrame, output: pd.DataFrame, trigger: str,
             first_output_ms: float, killed_ms: float, since: float, steps,
             kept: dict[str, str], bootstrap: str) -> RealtimeRun:
    expected = expected_counts(payments)
    report = check.audit_output(SCENARIO, "at_least_once", None, payments, output, expected)
    deduped = check.audit_output(f"{SCENARIO} + dedupe by id", "exactly_once", None, payments,
                                 check.dedupe_by_id(output), expected)
    for r in (report, deduped):
        r.fault = f"driver SIGKILLed {since:.1f} s after its last checkpoint"
    output = _copies(inputs, output)
    # the killed driver's records (stamped before the kill) that the restart wrote again
    before_kill = output[output["created_ms"] < killed_ms]
    rewritten = int(before_kill["id"].isin(output[output["created_ms"] >= killed_ms]["id"]).sum())
    return RealtimeRun(report, deduped, trigger, len(payments), round(since, 1), rewritten,
                       _latency(output, first_output_ms, killed_ms), output, killed_ms,
                       topics=kept, steps=steps, bootstrap=bootstrap)
