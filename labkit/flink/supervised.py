"""A Flink job under a supervisor: started, SIGKILLed at named moments of its checkpoints,
restarted from the latest retained checkpoint until the input is consumed, then audited.

    run = supervised.run(bootstrap, guarantee="exactly_once", kills=["before-commit"])
    run.report                 # the one audit of the output, read_committed
    run.kills                  # what each SIGKILL hit (labkit.flink.aim.Kill)
    run.latency                # input CreateTime -> visible to read_committed, p50/p99
    run.transactions           # the sink's transactional ids by their end state at the broker

Payments are produced at ``rate`` a second from the moment the first start has completed a
checkpoint, and go on ``stream_s`` seconds after the last kill, so every kill lands in a
stream and every restart has input to read. After each kill the job stays down ``down_s``
seconds (one number for every kill, or one per kill; ``transaction.timeout.ms`` is the
broker's patience with the sink's open transactions meanwhile) and starts again from the
last completed checkpoint, as a supervisor would. The run ends once the last start has
consumed the input and a checkpoint covering it has completed with no transaction left open
in the output (``labkit.flink.consumed``): then the job is stopped and the output audited.
"""
from __future__ import annotations

import json
import random
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.checking.audit import AuditReport, audit_topic
from labkit.flink import aim, checkpoints, visibility
from labkit.flink.consumed import EndWatch
from labkit.flink.outcome import FlinkJobError, commit_failures, flink_says, sink_transactions
from labkit.flink.runsetup import START_S, RunSetup, Start
from labkit.flink.process import JobProcess
from labkit.kafka import topics
from labkit.kafka.inspect.client import InspectError, Inspector
from labkit.pipelines import data

SCENARIO = "flink-two-phase-commit"
GUARANTEES = ("exactly_once", "at_least_once")
DONE_S = 120.0  # the last start to the input's end, committed
MAX_FAILURES = 2  # starts that end by themselves (not killed) before the run gives up


@dataclass
class FlinkRun:
    report: AuditReport
    guarantee: str
    checkpoint_interval_ms: int
    transaction_timeout_ms: int
    down_s: list[float]  # after each kill
    kills: list[aim.Kill]
    starts: list[Start]
    latency: dict[str, float]  # p50_ms, p99_ms, records: those visible before the first kill
    latency_all: dict[str, float]  # the same over every payment, the restarts' wait included
    transactions: dict[str, list[str]]  # end state at the coordinator -> the sink's ids
    flink_said: list[str]  # Flink's own log lines about commits that failed (data loss)
    topics: dict[str, str] = field(default_factory=dict)
    steps: list[tuple[float, str]] = field(default_factory=list, repr=False)
    run_dir: Path | None = None
    bootstrap: str = ""
    run_id: str = ""  # in every name of the run: topics, group, prefix, folder, processes
    history: tuple = ()  # (labkit.experiments.registry.Run's shape: no workers' history)

    @property
    def restore_s(self) -> list[float]:
        """Each restart's start to its first completed checkpoint (JVM, local cluster, restore)."""
        return [s.first_checkpoint_s for s in self.starts[1:] if s.first_checkpoint_s is not None]

    def summary(self) -> str:
        kills = "; ".join(k.describe() for k in self.kills) or "no kill"
        return (f"{self.report.summary()}\nFlink {self.guarantee}, checkpoints every "
                f"{self.checkpoint_interval_ms} ms, transaction.timeout.ms "
                f"{self.transaction_timeout_ms}: {kills}; down {self.down_s} s; "
                f"{len(self.starts)} starts; visible to read_committed after p50 "
                f"{self.latency['p50_ms']:.0f} ms, p99 {self.latency['p99_ms']:.0f} ms")

    def timeline(self) -> str:
        return "\n".join(f"{t:6.1f} s  {what}" for t, what in self.steps)

    def to_json(self) -> str:
        return json.dumps({
            **self.report.to_dict(), "checkpoint_interval_ms": self.checkpoint_interval_ms,
            "transaction_timeout_ms": self.transaction_timeout_ms, "down_s": self.down_s,
            "kills": [k.describe() for k in self.kills], "starts": len(self.starts),
            "restore_s": self.restore_s, "latency": self.latency,
            "transactions": {k: len(v) for k, v in self.transactions.items()},
            "flink_said": self.flink_said})

    def cleanup(self) -> None:
        """Delete the run's topics and folder (kept for a notebook's next cells)."""
        if self.topics:
            topics.delete(self.bootstrap, *self.topics.values())
            self.topics = {}
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None


def check_options(guarantee: str, kills, checkpoint_interval_ms: int,
                  transaction_timeout_ms: int, down_s: list[float], rate: float) -> None:
    if guarantee not in GUARANTEES:
        raise ValueError(f"guarantee must be one of {', '.join(GUARANTEES)}, not {guarantee!r}")
    for point in kills:
        if point not in aim.KILL_POINTS:
            raise ValueError(f"unknown kill point {point!r}: choose from "
                             f"{', '.join(aim.KILL_POINTS)}")
    if not 100 <= checkpoint_interval_ms <= 60_000:
        raise ValueError(f"checkpoint_interval_ms must be 100 to 60000, not "
                         f"{checkpoint_interval_ms}")
    if transaction_timeout_ms < 1000:
        raise ValueError(f"transaction_timeout_ms must be 1000 or more (the broker refuses "
                         f"less than 1 s), not {transaction_timeout_ms}")
    if len(down_s) != len(kills) or any(d < 0 for d in down_s) or not 1 <= rate <= 5000:
        raise ValueError(f"down_s must be 0 or more (one number, or one per kill) and rate 1 "
                         f"to 5000 a second (given {down_s} for {len(kills)} kills, {rate})")


def run(bootstrap: str, *, guarantee: str = "exactly_once",
        kills: tuple[str, ...] | list[str] = ("mid-checkpoint",),
        checkpoint_interval_ms: int = 1000, transaction_timeout_ms: int = 60_000,
        down_s: float | list[float] = 0.0, rate: float = 100.0, stream_s: float = 2.0,
        seed: int = 0, function: str = "fee_job", job_file: Path | None = None,
        job_code: str | None = None, keep_topics: bool = False,
        keep_files: bool = False) -> FlinkRun:
    """Run the job (``function`` in ``job_code``, a learner's cell, or in ``job_file``;
    default the lab's fee_job), SIGKILL it at
    each of ``kills`` in turn (labkit.flink.aim.KILL_POINTS), restart it from its latest
    checkpoint after ``down_s`` seconds (one number, or one per kill), and audit its output
    read_committed. ``keep_topics``/``keep_files``: leave the topics and the run's folder
    (checkpoints, logs) for ``FlinkRun.cleanup()``."""
    kills = list(kills)
    downs = [float(down_s)] * len(kills) if isinstance(down_s, (int, float)) else list(down_s)
    check_options(guarantee, kills, checkpoint_interval_ms, transaction_timeout_ms, downs, rate)
    r = RunSetup(bootstrap, guarantee, checkpoint_interval_ms, transaction_timeout_ms,
                 function, job_file, job_code)
    # more than the run can write: the producer stops stream_s after the last kill
    payments = data.generate(int(rate * (START_S + stream_s + len(kills) * START_S + sum(downs))),
                             seed=seed)
    try:
        topics.create(bootstrap, r.source, r.sink)
        _until_served(bootstrap, r.source, r.sink)
        done = _supervise(r, payments, guarantee, kills, downs, checkpoint_interval_ms, rate,
                          stream_s, random.Random(seed))
        return _audited(r, payments, guarantee, checkpoint_interval_ms, transaction_timeout_ms,
                        downs, done, keep_topics, keep_files)
    except BaseException:
        r.remove()
        topics.delete(bootstrap, r.source, r.sink)
        raise


def _supervise(r: RunSetup, payments: list[dict], guarantee: str, kills: list[str],
               downs: list[float], interval_ms: int, rate: float, stream_s: float,
               rng: random.Random) -> list[aim.Kill]:
    """Start, kill at each point, restart, until the input is consumed; the kills."""
    stop_payments, failed = threading.Event(), []
    producer = threading.Thread(target=data.produce_at_rate, daemon=True, name="payments",
                                args=(r.bootstrap, r.source, payments, rate, stop_payments,
                                      failed))
    done: list[aim.Kill] = []
    job: JobProcess | None = None
    try:
        for _ in range(len(kills) + 1 + MAX_FAILURES):
            with Inspector(r.bootstrap) as inspector:  # what the starts before this one wrote
                output_from = inspector.offsets(r.sink)[0].high_watermark
            job, restored = r.start()
            before = checkpoints.latest(r.checkpoints)
            took = r.first_checkpoint(job, before.id if before else 0)
            r.step(f"{job.name}: first checkpoint {took:.1f} s after its start")
            if not producer.is_alive() and not stop_payments.is_set():
                producer.start()
                r.step(f"payments arrive at {rate:g} a second")
            if len(done) < len(kills):
                hit = aim.kill_at(job, kills[len(done)], checkpoint_root=r.checkpoints,
                                  bootstrap=r.bootstrap, prefix=r.prefix, output_topic=r.sink,
                                  exactly_once=guarantee == "exactly_once",
                                  interval_ms=interval_ms, rng=rng, timeout_s=START_S)
                down = downs[len(done)]
                done.append(hit)
                r.starts.append(Start(job.name, restored, r.now(), took, "killed"))
                r.step(f"{job.name}: {hit.describe()}")
                if len(done) == len(kills):
                    _later(stream_s, stop_payments.set)
                if down:
                    r.step(f"the job stays down {down:g} s")
                    time.sleep(down)
                continue
            if not kills:
                _later(stream_s, stop_payments.set)
            ended = _until_consumed(r, job, producer, output_from)
            r.starts.append(Start(job.name, restored, r.now(), took, ended))
            if ended == "stopped":
                break
        else:
            raise FlinkJobError(job, f"the job failed {MAX_FAILURES + 1} times by itself")
    finally:
        stop_payments.set()
        if job is not None:
            job.stop()
        if producer.is_alive():
            producer.join(30)
    if failed:
        raise RuntimeError(f"payments could not be produced: {failed[:3]}")
    return done


def _until_served(bootstrap: str, *names: str, timeout_s: float = 30.0) -> None:
    """Wait until each new topic's leader answers for it: metadata names the leader a
    moment before the broker serves the partition (NOT_LEADER_OR_FOLLOWER meanwhile)."""
    deadline = time.monotonic() + timeout_s
    with Inspector(bootstrap) as inspector:
        for name in names:
            while True:
                try:
                    inspector.offsets(name)
                    break
                except InspectError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)


def _later(seconds: float, what) -> None:
    timer = threading.Timer(seconds, what)
    timer.daemon = True
    timer.start()


def _until_consumed(r: RunSetup, job: JobProcess, producer: threading.Thread,
                    output_from: int) -> str:
    """Wait until the input is consumed (then stop the job: "stopped"), or the job ends by
    itself (Flink's error, the next start goes on from the latest checkpoint)."""
    deadline = time.monotonic() + DONE_S
    with Inspector(r.bootstrap) as inspector:
        end = EndWatch(inspector, r.source, r.sink, r.group, r.checkpoints, output_from)
        while producer.is_alive() or not end.done():
            if not job.alive:
                said = flink_says(job) or "it ended by itself"
                r.step(f"{job.name}: failed: {said}")
                return said
            if time.monotonic() > deadline:
                raise FlinkJobError(job, f"the input was not consumed {DONE_S:.0f} s after the "
                                         "last start")
            time.sleep(0.2)
    job.stop()
    r.step(f"{job.name}: the input is consumed and committed; the job is stopped")
    return "stopped"


def _audited(r: RunSetup, payments: list[dict], guarantee: str, interval_ms: int,
             timeout_ms: int, down_s: list[float], kills: list[aim.Kill], keep_topics: bool,
             keep_files: bool) -> FlinkRun:
    written = {rec.value["id"] for rec in topics.read(r.bootstrap, r.source)}
    inputs = [p for p in payments if p["id"] in written]
    fault = "; ".join(k.describe() for k in kills) or None
    report = audit_topic(r.bootstrap, r.sink, inputs, SCENARIO, guarantee, fault=fault)
    found = visibility.delays(r.bootstrap, r.source, r.sink)
    with Inspector(r.bootstrap) as inspector:
        transactions = sink_transactions(inspector, r.prefix)
    said = commit_failures(r.dir)
    kept = {"input": r.source, "output": r.sink}
    run = FlinkRun(report, guarantee, interval_ms, timeout_ms, down_s, kills, r.starts,
                   visibility.quantiles(found, visible_before_ms=min(
                       (k.at * 1000 for k in kills), default=float("inf"))),
                   visibility.quantiles(found), transactions, said, topics=kept,
                   steps=r.steps, run_dir=r.dir, bootstrap=r.bootstrap, run_id=r.id)
    if not keep_topics:
        topics.delete(r.bootstrap, r.source, r.sink)
        run.topics = {}
    if not keep_files:
        r.remove()
        run.run_dir = None
    return run
