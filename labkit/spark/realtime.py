"""A Kafka-to-Kafka query under a driver crash, whatever its trigger: Spark's real-time mode
against a micro-batch, its latency and what one crash writes twice (issue 30).

    run = experiments.run("spark-realtime", pipeline=copy_query)  # the learner's query
    run.report          # the output topic as written: Spark's Kafka sink is at-least-once
    run.deduped         # the same records after a downstream dedupe by payment id
    run.latency         # output CreateTime - input CreateTime, records copied before the kill

``labkit.experiments.spark_realtime`` composes it: the query as its clients
(``RealtimeCopy``), the driver's SIGKILL as its nemesis (``KillDriver``, ``kill_after``
seconds after the event ``checkpoint``), ``audit_copy`` as its checker.

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
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from confluent_kafka import Consumer, TopicPartition

from labkit.checking import reads
from labkit.checking.audit import expected_counts
from labkit.checking.checks import Counted
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
MAX_RATE = 10_000  # payments a second


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




def read_stamped(run: Any, role: str) -> pd.DataFrame:
    """Every record of the run's ``role`` topic (read_committed, through ``reads.topic``:
    kept in the history): partition, offset, id and key (the payment's), record_key (the
    Kafka record's key) and created_ms (its CreateTime)."""
    return pd.DataFrame([(r.partition, r.offset, r.value["id"], r.value["key"], r.key,
                          r.timestamp_ms)
                         for r in reads.topic(run, role, stamped=True).committed],
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
        self.killed = False  # by the lab (KillDriver): its crash is no failure

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
        if self.result is not None and self.result.crashed and not self.killed:
            raise SparkJobError("the Spark worker died before it was killed (see its log)")

    def kill(self) -> None:
        """SIGKILL the worker, Python driver and JVM at once; wait for its thread to end."""
        self.killed = True
        self.worker.sigkill()
        self.thread.join(30)

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


def check_learner_query(query: Callable, o: Any) -> None:
    """The learner's query, before anything starts: its trigger is its own, and it names
    only what the worker provides."""
    if o.trigger is not None:
        raise ValueError("the learner's query sets its own trigger: leave trigger= out")
    check_query(query)


def check_rate(rate: float, **_: Any) -> None:
    if rate > MAX_RATE:
        raise ValueError(f"rate must be 1 to {MAX_RATE} payments a second, not {rate}")


class RealtimeCopy:
    """The query as the run's clients (see the module's docstring): the run's inputs are
    the payments, produced at ``rate`` a second; the first checkpoint is reported as the
    event ``checkpoint``, and it waits (``kill_within_s``) for the nemesis to ``kill`` it.
    Its facts: ``trigger`` (as Spark applied it), ``first_output_ms``, ``killed_ms`` (the
    SIGKILL sent), ``gone_ms`` (the driver's processes gone) and
    ``killed_after_checkpoint_s``."""

    def __init__(self, query: Callable, *, rate: float, after_kill: float, spare: bool,
                 kill_within_s: float):
        self.code, self.name = check_query(query), query.__name__
        self.rate, self.after_kill, self.spare = rate, after_kill, spare
        self.kill_within_s = kill_within_s
        self.drivers: list[_Driver] = []
        self.killed = threading.Event()
        self.killed_ms = self.gone_ms = self.since = 0.0
        self.checkpoint = Path()
        self.sink = ""
        self.watcher: Consumer | None = None

    def _start(self, worker, job: dict, workdir: Path) -> _Driver:
        stop = workdir / f"stop-{len(self.drivers) + 1}"
        self.drivers.append(_Driver(worker, {**job, "stop_file": str(stop)}, stop))
        return self.drivers[-1]

    def kill(self, say: Callable[..., None]) -> None:
        """SIGKILL the first driver (KillDriver's way in), say so, and let the run go on."""
        last = _checkpoints(self.checkpoint)[-1]
        out_at_kill = _output_size(self.watcher, self.sink)
        self.killed_ms = time.time() * 1000
        self.drivers[0].kill()
        self.gone_ms = time.time() * 1000  # the driver's processes are gone: it wrote before
        self.since = self.killed_ms / 1000 - last
        say(f"SIGKILL the driver (Python and JVM) {self.since:.1f} s after its last "
            f"checkpoint, {out_at_kill} records in the output",
            after_checkpoint_s=round(self.since, 1))
        self.killed.set()

    def __call__(self, run: Any) -> None:
        source, self.sink = run.topics["input"], run.topics["output"]
        self.checkpoint = run.workdir / "checkpoint"
        job = {"op": "copy", "bootstrap": run.bootstrap, "topic": source,
               "output_topic": self.sink, "checkpoint": str(self.checkpoint),
               "query_code": self.code}
        self.watcher = Consumer(client_config({"bootstrap.servers": run.bootstrap,
                                               "group.id": "labkit-reader"}))
        failed: list[str] = []
        stop_payments = threading.Event()
        producer = threading.Thread(target=data.produce_at_rate, daemon=True, name="payments",
                                    args=(run.bootstrap, source, run.inputs, self.rate,
                                          stop_payments, failed))
        try:
            first = self._start(fresh_worker(spare=self.spare), job, run.workdir)
            wait_until(lambda: first.started.is_set(), "the query to start", START_S)
            first.check()
            run.observe(trigger=first.trigger)
            run.step(f"{self.name} started in a fresh Spark worker; payments arrive at "
                     f"{self.rate:g} a second", "the query's first output")
            producer.start()
            wait_until(lambda: first.check() or _output_size(self.watcher, self.sink) > 0,
                       "the query's first output", START_S)
            run.observe(first_output_ms=time.time() * 1000)
            wait_until(lambda: first.check() or bool(_checkpoints(self.checkpoint)),
                       "the query's first checkpoint", START_S)
            run.event("checkpoint", batch=0)
            wait_until(lambda: first.check() or self.killed.is_set(),
                       "the nemesis to SIGKILL the driver", self.kill_within_s)
            run.observe(killed_ms=self.killed_ms, gone_ms=self.gone_ms,
                        killed_after_checkpoint_s=round(self.since, 1))
            second = self._start(shared_worker(), job, run.workdir)
            run.step("the query restarts on the same checkpoint (a warm worker)")
            stop_payments.wait(max(0.0, self.killed_ms / 1000 + self.after_kill - time.time()))
            stop_payments.set()
            producer.join(60)
            ends = {p: _end(self.watcher, source, p) for p in range(PARTITIONS)}
            wait_until(lambda: second.check() or _committed_up_to(self.checkpoint, source) == ends,
                       f"the restarted query to checkpoint the input's end "
                       f"({sum(ends.values())} records)", DONE_S)
            second.stop()
            run.step("the restarted query checkpointed the input's end: it is stopped")
            if failed:
                raise RuntimeError(f"the producer failed: {failed[:3]}")
        finally:  # also on a failure: no query left running, no thread writing
            for driver in self.drivers:
                if driver.thread.is_alive():
                    driver.worker.sigkill()
                    driver.thread.join(30)
            self.watcher.close()
            stop_payments.set()
            if producer.is_alive():
                producer.join(60)


def audit_copy(run: Any) -> Counted:
    """The checker: both topics read back; the output as written (at least once: Spark's
    Kafka sink) against the payments the input holds, and after a dedupe by id (the fact
    ``deduped``). Facts: ``records``, ``output`` (every output record with delay_ms and
    copy, ``_copies``). Its reads and the kill it names are the history's: a stored run
    re-checks it."""
    inputs = read_stamped(run, "input")
    output = read_stamped(run, "output")
    (kill,) = [e for e in reads.events(run) if e.get("kind") == "fault"
               and e.get("fault") == "KillDriver"]
    written = set(inputs["id"])  # the payments the input topic holds: what the audit expects
    payments = [p for p in run.inputs if p["id"] in written]
    expected = expected_counts(payments)
    report = check.audit_output(SCENARIO, "at_least_once", None, payments, output, expected)
    deduped = check.audit_output(f"{SCENARIO} + dedupe by id", "exactly_once", None, payments,
                                 check.dedupe_by_id(output), expected)
    for r in (report, deduped):
        r.fault = (f"driver SIGKILLed {kill['after_checkpoint_s']:.1f} s after its "
                   "last checkpoint")
    return Counted(report, {"deduped": deduped, "records": len(payments),
                            "output": _copies(inputs, output)})


audit_copy.replayable = True  # type: ignore[attr-defined]  (labkit.experiments.recheck)


def facts(run: Any) -> dict:
    """``rewritten``: the killed driver's records that its restart wrote again (stamped
    before its processes were gone: one it wrote as the SIGKILL was on its way is its own,
    not the restart's); ``latency``: p50 and p99 of the copies before the kill."""
    output, killed_ms = run.facts["output"], run.facts["killed_ms"]
    gone_ms = run.facts.get("gone_ms", killed_ms)  # a run stored before it was a fact
    before_kill = output[output["created_ms"] < gone_ms]
    rewritten = int(before_kill["id"].isin(output[output["created_ms"] >= gone_ms]["id"]).sum())
    return {"rewritten": rewritten,
            "latency": _latency(output, run.facts["first_output_ms"], killed_ms)}


def summary(run: Any) -> str:
    return (f"{run.report.summary()}\ntrigger {run.trigger}: SIGKILL "
            f"{run.killed_after_checkpoint_s:.1f} s after its last checkpoint, "
            f"{run.rewritten} of its records written again; latency p50 "
            f"{run.latency['p50_ms']:.0f} ms, p99 {run.latency['p99_ms']:.0f} ms; "
            f"after a dedupe by id: {run.deduped.verdict}")


def to_dict(run: Any) -> dict:
    """The CLI's JSON: the audit's keys, then the run's own, in the order they always had."""
    return {**run.report.to_dict(), "trigger": run.trigger,
            "killed_after_checkpoint_s": run.killed_after_checkpoint_s,
            "rewritten": run.rewritten, **run.latency,
            "deduped_verdict": run.deduped.verdict, "deduped_duplicated": run.deduped.duplicated}
