"""Spark workers: a streaming query run in a child process (its Python driver and JVM), armed
with a crash point or not, kept warm between runs.

    job = StreamJob(query="q", topic="in", bootstrap=b, checkpoint="/tmp/ck",
                    sink=SinkSpec("naive", db_url="sqlite:////tmp/ck.db"))
    with SparkWorker() as worker:
        result = worker.run(job.message())       # events, result, crashed?
    warm_up()                                    # a shared worker and a spare, started now

Crashing a query and restarting it until done: ``labkit.spark.supervised``.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit import proc, progress, settings

from labkit.faults.crashpoints import CRASH_POINTS, arm
from labkit.paths import spark_remote
from labkit.progress import status
from labkit.spark.sinks import SinkSpec

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
    # A learner's query function instead of the lab's query (same form as sink_code): it
    # builds the Kafka source and starts the stream with the lab's foreachBatch (child.py).
    query_code: dict[str, str] | None = None
    # A learner's transform of each batch's rows, with the lookup (same form as sink_code):
    # called as the lab's ``lookup.apply_threshold`` would be (child.py).
    transform_code: dict[str, str] | None = None

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

    def sigkill(self) -> None:
        """SIGKILL the worker and its JVM now, from outside (a crash the lab times, where no
        crash point can be armed): the ``run`` in progress on another thread sees the pipe
        close, returns ``crashed=True`` and cleans up. Never reused after this."""
        if self.proc is not None:
            self.spent = True
            proc.kill([self.proc, *proc.find(self._marker)])

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
