"""Run a streaming query in a child process, crash it at a named point, restart it.

    job = StreamJob(query="q", topic="in", bootstrap=b, checkpoint="/tmp/ck",
                    sink=SinkSpec("naive", db_url="sqlite:////tmp/ck.db"))
    run = run_until_done(job, crash_at="spark-after-sink-before-commit", hit=2)
    run.timeline          # one row per batch per attempt: which batch ran, which crashed
    run.attempts[0].checkpoint   # the checkpoint right after the crash

The first attempt runs in a fresh worker armed with the crash point (SIGKILL of the whole
worker: Python driver and, through the closed gateway pipe, its JVM). The restart runs on a
warm, unarmed worker (shared, to save a Spark start) from the same checkpoint; for
``resume="database"`` it starts a new checkpoint at the offsets the sink stored. A spare
fresh worker is started in the background for the next crash experiment.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

from labkit import proc, progress, settings

from labkit.kafka import topics
from labkit.faults.crashpoints import CRASH_POINTS, arm
from labkit.paths import spark_remote
from labkit.progress import status
from labkit.spark import checkpoint as ckpt
from labkit.spark.sinks import SinkSpec, create_tables, stored_offsets

SPARK_CRASH_POINTS = tuple(p for p in CRASH_POINTS if p.startswith("spark-"))
READY_TIMEOUT_S = 180.0
JOB_TIMEOUT_S = 600.0
JVM_EXIT_TIMEOUT_S = 30.0


class SparkJobError(RuntimeError):
    """The job failed inside the worker (the worker itself is still usable)."""


class OrphanJvm(RuntimeError):
    """A worker's JVM outlived it (it was killed; this is a bug worth reporting)."""


@dataclass(frozen=True)
class StreamJob:
    """One streaming query: Kafka topic -> sink, with a checkpoint."""

    query: str
    topic: str
    bootstrap: str
    checkpoint: str
    sink: SinkSpec
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int = 20
    # A lookup table (database url) the batch's rows are transformed with when processed:
    # labkit.spark.replay's review threshold, which changes between a crash and the replay.
    lookup: str | None = None
    # Extra Kafka source options, e.g. {"kafka.isolation.level": "read_committed"} (Spark's
    # source inherits the Java client's default, read_uncommitted).
    source_options: dict[str, str] = field(default_factory=dict)
    # A learner's foreachBatch function instead of the lab's sink: {"code": the text of the
    # cell that defines it, "function": its name} (labkit.pipelines.learner). The sink's
    # tables are still the lab's, so the audit reads the same columns.
    sink_code: dict[str, str] | None = None

    def message(self) -> dict:
        return {"op": "stream", **asdict(self)}  # asdict turns the nested SinkSpec into a dict too


@dataclass
class JobResult:
    events: list[dict]
    result: dict | None
    crashed: bool
    returncode: int | None
    seconds: float


class SparkWorker:
    """A child Python process with its own SparkSession, taking jobs over a pipe."""

    def __init__(self, log_dir: str | Path | None = None):
        self.tag = uuid.uuid4().hex[:12]
        self.log_dir = Path(log_dir) if log_dir else None
        self.proc: subprocess.Popen | None = None
        self.jvm_pid: int | None = None
        self._jvm = None  # its psutil.Process once ready: signals never reach a recycled pid
        self._returncode: int | None = None
        self.startup_s: float | None = None
        self.jvm_exit_s: float | None = None  # how long the JVM lived on after the worker
        self.spent = False  # ran an armed job: its crash-point counters are used, never reuse
        self._buf = b""
        self._cwd: str | None = None

    # -- lifecycle ----------------------------------------------------------
    def spawn(self) -> "SparkWorker":
        """Start the process (Spark starts in the background); ``wait_ready`` waits for it.

        Spawned from the calling thread on purpose: PR_SET_PDEATHSIG fires when the thread
        that forked the child ends, so a helper thread would kill the worker with it.
        """
        jobs_r, jobs_w = os.pipe()
        replies_r, replies_w = os.pipe()
        log = open(self.log_dir / f"worker-{self.tag}.log", "ab") if self.log_dir else subprocess.DEVNULL
        # Its own working dir: Spark 4 writes an artifacts/ dir into the cwd, which would
        # otherwise litter the learner's notebooks/ folder.
        self._cwd = tempfile.mkdtemp(prefix="labkit-spark-")
        try:
            self.proc = proc.spawn(  # the worker dies with its owner (e.g. a kernel)
                [sys.executable, "-m", "labkit.spark.child", str(jobs_r), str(replies_w), self.tag],
                cwd=self._cwd,
                pass_fds=(jobs_r, replies_w), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, group=True)
        except BaseException:  # nothing started: leave no pipes or directory behind
            for fd in (jobs_r, jobs_w, replies_r, replies_w):
                os.close(fd)
            shutil.rmtree(self._cwd, ignore_errors=True)
            raise
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        os.close(jobs_r)
        os.close(replies_w)
        self._jobs = os.fdopen(jobs_w, "w", buffering=1)
        self._replies = replies_r
        return self

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> "SparkWorker":
        """Wait for the worker's "ready": its SparkSession is up (the JVM answered through
        its gateway). A worker that does not get there (Spark failed, the JVM hangs, the
        wait timed out or was interrupted) is killed with its JVM before the error is
        raised: a JVM stuck before it reads its stdin would outlive its worker for good."""
        if self.jvm_pid is not None:
            return self
        try:
            with status("Starting a Spark worker (a Python driver with its own JVM)"):
                ready = self._next(timeout_s)
        except BaseException:  # TimeoutError, Ctrl-C
            self._kill()
            raise
        if ready is None or ready.get("event") != "ready":
            self._kill()
            raise SparkJobError(f"the Spark worker did not start (exit code {self.returncode}); "
                                f"see {self.log_dir or 'its log (pass log_dir)'}")
        self.jvm_pid, self.startup_s = ready["jvm_pid"], ready["startup_s"]
        self._jvm = proc.process(self.jvm_pid)
        return self

    def start(self) -> "SparkWorker":
        return self.spawn().wait_ready()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The worker's exit code once it has ended (kept after its cleanup)."""
        return self.proc.returncode if self.proc is not None else self._returncode

    @property
    def _marker(self) -> str:
        return f"labkit.worker={self.tag}"  # in its JVM's command line (labkit.spark.child)

    def _kill(self) -> None:
        """SIGKILL the worker and everything it started (its JVM; a spark-submit still
        launching one), also what was already re-parented, then clean up."""
        if self.proc is None:
            return
        proc.kill([self.proc, *proc.find(self._marker)])
        self._cleanup()

    def close(self) -> None:
        """Ask the worker to stop Spark and exit; kill it if it does not."""
        if self.proc is None:
            return
        if self.alive and self.jvm_pid is None:
            # Never became ready (e.g. an unused spare): nothing to stop cleanly; its JVM,
            # if already launched, goes with it.
            self._kill()
            return
        if self.alive:
            try:
                self._jobs.write(json.dumps({"op": "exit"}) + "\n")
                self._jobs.flush()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self._kill()
                return
        self._cleanup()

    def _cleanup(self) -> None:
        for closer in (self._jobs.close, lambda: os.close(self._replies)):
            try:
                closer()
            except OSError:
                pass
        self.jvm_exit_s = self.wait_jvm_gone()
        self._returncode = self.proc.returncode
        self.proc = None
        if self._cwd:
            shutil.rmtree(self._cwd, ignore_errors=True)

    def wait_jvm_gone(self, timeout_s: float = JVM_EXIT_TIMEOUT_S) -> float:
        """Seconds the JVM took to exit after its driver; OrphanJvm if it would not."""
        started = time.monotonic()
        jvm = self._jvm
        if jvm is None:  # killed before it said ready: its JVM may still be starting
            found = proc.find(self._marker)
            jvm = found[0] if found else None
            if self.jvm_pid is None and jvm is not None:
                self.jvm_pid = jvm.pid
        # its psutil.Process (start time included) and our tag: a recycled pid is not our JVM
        while jvm is not None and proc.ours(jvm.pid, jvm.create_time(), self._marker):
            if time.monotonic() - started > timeout_s:
                proc.kill([jvm])
                raise OrphanJvm(f"the Spark JVM (pid {jvm.pid}) outlived its worker by "
                                f"{timeout_s:.0f} s and was killed")
            time.sleep(0.05)
        return time.monotonic() - started

    def _find_jvm(self) -> int | None:
        """The pid of a process carrying this worker's tag (its JVM, or the spark-submit
        launching it), None while there is none."""
        found = proc.find(self._marker)
        return found[0].pid if found else None

    # -- jobs ---------------------------------------------------------------
    def _next(self, timeout_s: float) -> dict | None:
        """The next reply line, or None at EOF (the worker died)."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the Spark worker gave no answer within {timeout_s:.0f} s")
            ready, _, _ = select.select([self._replies], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._replies, 65536)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def run(self, message: dict, crash_at: str | None = None, hit: int = 1,
            timeout_s: float = JOB_TIMEOUT_S,
            on_event: Callable[[dict], None] | None = None) -> JobResult:
        """Run one job; with ``crash_at`` the worker SIGKILLs itself at that point's
        ``hit``-th visit (``crashed=True`` in the result) and is never reused."""
        if not self.alive:
            raise SparkJobError("the Spark worker is not running; start() it first")
        if self.spent:
            raise SparkJobError("this worker ran an armed job; use a fresh one")
        self.wait_ready()
        # The connection settings as they are now, not as when this (warm) worker started.
        message = {**message, "env": settings.connection_env()}
        if crash_at:
            message = {**message, "arm": arm(crash_at, hit)}
            self.spent = True
        try:
            return self._collect(message, timeout_s, on_event)
        except (KeyboardInterrupt, TimeoutError):
            # A job cut short leaves the worker mid-query: stop it and its JVM, never reuse it.
            self._kill()
            raise

    def _collect(self, message: dict, timeout_s: float, on_event) -> JobResult:
        started = time.monotonic()
        events: list[dict] = []
        self._jobs.write(json.dumps(message) + "\n")
        while True:
            event = self._next(timeout_s)
            if event is None:  # EOF: the worker was killed (a crash point) or died
                self.proc.wait(timeout=30)
                code = self.proc.returncode
                self._cleanup()
                return JobResult(events, None, True, code, time.monotonic() - started)
            if event["event"] == "done":
                return JobResult(events, event["result"], False, None, time.monotonic() - started)
            if event["event"] == "error":
                raise SparkJobError(f"{event['type']}: {event['message']}")
            events.append(event)
            progress.beat(f"the query's next event after {event['event']}")  # the watchdog's
            if on_event is not None:
                on_event(event)

    def __enter__(self) -> "SparkWorker":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.close()


_shared: SparkWorker | None = None
_spare: SparkWorker | None = None


def shared_worker(log_dir: str | Path | None = None) -> SparkWorker:
    """A warm, unarmed worker reused by restarts and recounts (one Spark start per process)."""
    global _shared
    if _shared is None or not _shared.alive:
        _shared = SparkWorker(log_dir=log_dir).start()
    return _shared


def fresh_worker(log_dir: str | Path | None = None, spare: bool = True) -> SparkWorker:
    """A worker that never ran an armed job, for the next crash; a spare one is kept starting
    in the background so a series of crash experiments does not wait for Spark each time
    (``spare=False`` for the last one: a spare nobody uses costs a Spark start of CPU)."""
    global _spare
    worker = _spare if _spare is not None and _spare.alive else SparkWorker(log_dir).spawn()
    _spare = SparkWorker(log_dir).spawn() if spare else None
    return worker.wait_ready()


def warm_up(log_dir: str | Path | None = None, wait: bool = True) -> None:
    """Start the shared worker and a spare crash worker now (e.g. while a lesson explains),
    so the first experiment does not wait for Spark."""
    global _spare
    if _spare is None or not _spare.alive:
        _spare = SparkWorker(log_dir).spawn()
    shared_worker(log_dir)
    if wait:
        _spare.wait_ready()


@atexit.register
def close_workers() -> None:
    """Stop the shared and spare workers (also run at interpreter exit)."""
    global _shared, _spare
    for worker in (_shared, _spare):
        if worker is not None:
            worker.close()
    _shared = _spare = None


def _remote_recount(bootstrap: str, topic: str, source_options: dict[str, str] | None) -> dict[str, int]:
    """The recount on the Spark Connect server (LABKIT_SPARK_REMOTE): a batch query kills no
    driver, so it runs where the room's Spark is; the same query as the worker's."""
    from labkit.spark.child import recount as batch_recount
    from labkit.spark.session import session

    job = {"bootstrap": bootstrap, "topic": topic, "source_options": source_options or {}}
    return dict(sorted(batch_recount(session("labkit-recount"), job, None)["counts"].items()))


def recount(bootstrap: str, topic: str, worker: SparkWorker | None = None,
            source_options: dict[str, str] | None = None) -> dict[str, int]:
    """Counts per key of a whole topic by a Spark batch query (the stream's ground truth);
    ``source_options`` as the stream's (a transactional input is recounted read_committed)."""
    if worker is None and spark_remote():
        return _remote_recount(bootstrap, topic, source_options)
    res = (worker or shared_worker()).run({"op": "recount", "bootstrap": bootstrap, "topic": topic,
                                           "source_options": source_options or {}})
    return dict(sorted(res.result["counts"].items()))


# ------------------------------------------------------------------ crash, restart, replay


@dataclass
class Attempt:
    number: int
    crash_at: str | None
    crashed: bool
    returncode: int | None
    seconds: float
    checkpoint_dir: str
    starting_offsets: str
    events: list[dict]
    checkpoint: pd.DataFrame = field(repr=False)  # ckpt.batches() right after the attempt
    jvm_exit_s: float | None = None  # how long the JVM took to die after a crash
    jvm_pid: int | None = None


@dataclass
class Run:
    job: StreamJob
    attempts: list[Attempt]

    @property
    def crashed(self) -> bool:
        return any(a.crashed for a in self.attempts)

    @property
    def timeline(self) -> pd.DataFrame:
        """One row per batch per attempt: rows, outcome, and whether it was a replay."""
        rows = []
        for a in self.attempts:
            committed = set(a.checkpoint.loc[a.checkpoint["committed"], "batch_id"])
            ends = {e["batch"]: e for e in a.events if e["event"] == "batch-end"}
            starts = [e for e in a.events if e["event"] == "batch-start"]
            for i, e in enumerate(starts):
                batch, end = e["batch"], ends.get(e["batch"])
                outcome = "committed" if batch in committed else "planned, not committed"
                if a.crashed and i == len(starts) - 1:  # the batch the crash hit
                    outcome = ("committed, then crashed" if batch in committed else
                               "sink done, crashed before commit" if end else "crashed in the sink")
                rows.append({"attempt": a.number, "batch_id": batch, "rows": e["rows"],
                             "outcome": outcome,
                             "skipped": ", ".join(end.get("skipped", [])) if end else ""})
        frame = pd.DataFrame(rows, columns=["attempt", "batch_id", "rows", "outcome", "skipped"])
        # A replay re-reads an offset range an earlier attempt already ran (batch ids
        # restart when the transactional sink resumes on a new checkpoint, ranges do not).
        earlier: set = set()
        replay = []
        for a in self.attempts:
            ranges = {b: tuple(map(tuple, g[["topic", "partition", "start_offset", "end_offset"]].values))
                      for b, g in a.checkpoint.groupby("batch_id")}
            ran = frame.loc[frame["attempt"] == a.number, "batch_id"]
            replay += [ranges.get(b) in earlier for b in ran]
            earlier |= {ranges.get(b) for b in ran}
        frame["replay"] = replay
        return frame


def database_offsets(job: StreamJob) -> str:
    """startingOffsets JSON from the transactional sink's table ("earliest" where none)."""
    stored = stored_offsets(job.sink)
    parts = topics.partitions_of(job.bootstrap, job.topic)
    return json.dumps({job.topic: {str(p): stored.get((job.topic, p), -2) for p in parts}})


def _start_of(job: StreamJob) -> dict[str, dict[int, int]] | None:
    """Where batch 0 began, for the checkpoint view (-2, "earliest", is offset 0 here)."""
    return ckpt.starting_positions(job.starting_offsets)


_said_local = False


def _say_local_driver() -> None:
    """Once per process: with LABKIT_SPARK_REMOTE set, a crash experiment still runs its
    query on a local driver (stderr, beside the progress lines; compared outputs stay alike)."""
    global _said_local
    if spark_remote() and not _said_local:
        _said_local = True
        print(f"LABKIT_SPARK_REMOTE={spark_remote()} is set, but crash experiments SIGKILL their "
              "Spark driver: they run on a local one (batch queries such as the recount run "
              "on the server)", file=sys.stderr)


def run_until_done(job: StreamJob, crash_at: str | None = None, hit: int = 1, *,
                   resume: str = "checkpoint", max_attempts: int = 3,
                   worker: SparkWorker | None = None, log_dir: str | Path | None = None,
                   on_event: Callable[[dict], None] | None = None, spare: bool = True) -> Run:
    """Run ``job``, SIGKILLed at ``crash_at`` on its ``hit``-th visit, restarted until done.

    ``resume="checkpoint"``: every attempt uses ``job.checkpoint`` (Spark replays an
    uncommitted batch). ``resume="database"`` (transactional sink): each attempt starts a
    fresh checkpoint at the offsets stored in the sink's database. ``on_event`` sees every
    batch event as it happens, with its attempt number (for a live view). ``spare=False``:
    start no spare worker for a next crash experiment (see ``fresh_worker``).
    """
    if crash_at is not None and crash_at not in SPARK_CRASH_POINTS:
        raise ValueError(f"crash point {crash_at!r} is not a Spark one; valid: "
                         f"{', '.join(SPARK_CRASH_POINTS)}")
    if resume not in ("checkpoint", "database"):
        raise ValueError(f"resume must be 'checkpoint' or 'database', not {resume!r}")
    if resume == "database" and job.sink.kind != "transactional":
        raise ValueError("resume='database' needs the transactional sink (it stores offsets)")
    create_tables(job.sink)
    _say_local_driver()
    attempts: list[Attempt] = []
    for number in range(1, max_attempts + 1):
        progress.check()  # a run its watchdog stopped starts no next attempt
        current = job
        if resume == "database":
            current = replace(job, checkpoint=str(Path(job.checkpoint) / f"attempt-{number}"),
                              starting_offsets=database_offsets(job))
        ckpt.claim(current.checkpoint, current.query, current.topic)
        armed = crash_at if number == 1 else None
        tell = (lambda e, n=number: on_event({**e, "attempt": n})) if on_event else None
        if armed:
            with fresh_worker(log_dir, spare) as fresh:
                result = fresh.run(current.message(), armed, hit, on_event=tell)
            jvm_exit, jvm_pid = (fresh.jvm_exit_s if result.crashed else None), fresh.jvm_pid
            if result.crashed and tell:
                tell({"event": "crashed", "crash_at": armed})
        else:
            used = worker or shared_worker(log_dir)
            result = used.run(current.message(), on_event=tell)
            jvm_exit, jvm_pid = None, used.jvm_pid
        attempts.append(Attempt(number, armed, result.crashed, result.returncode, result.seconds,
                                current.checkpoint, current.starting_offsets, result.events,
                                ckpt.batches(current.checkpoint, _start_of(current)), jvm_exit,
                                jvm_pid))
        if not result.crashed:
            return Run(job, attempts)
    raise SparkJobError(f"the query crashed {max_attempts} times; see the attempts' events")
