"""A Flink job as an experiment's clients: started, restarted from the latest retained
checkpoint after each kill (as a supervisor would), until the input is consumed.

    clients = FlinkJob("exactly_once", interval_ms=1000, timeout_ms=60_000, rate=100,
                       stream_s=2, job_code=code_of(learners_job), function="my_job")
    nemesis = Nemesis(AimedKill("mid-checkpoint", on("checkpointed", start=1)))

Attached to the run, the job gets the run's names (its topics, its group, the run's
transactional id as the sink's prefix) and the run's folder (checkpoints, each start's
settings, output and Flink log), and stands as the run's ``workers``: ``kill_at`` is the
aimed SIGKILL's way in (``labkit.flink.aim.AimedKill``). Run, each start is a step of the
run's timeline, and once it has completed its first checkpoint it reports the event
``checkpointed`` (``start``: 1 for the first): a fault waiting for it fires right there, in
this thread, and the job is restarted once the fault returns (a kill that keeps the job down
does so by returning later). Payments are produced at ``rate`` a second from the first
start's first checkpoint (its event waits for ``steady_checkpoints`` more, so the first
kill comes after a steady stream), and go on ``stream_s`` seconds after the last kill, so
every kill lands in a stream and every restart has input to read. The run ends once the last
start has consumed the input and a checkpoint covering it has completed with no transaction
left open in the output (``labkit.flink.consumed``): then the job is stopped. The run's
inputs are then the payments the producer wrote.

``RefusedStart`` starts the job once and expects it to fail by itself before its first
checkpoint (a transaction timeout above the broker's maximum): Flink's words are a fact.
"""
from __future__ import annotations

import random
import threading
import time
from typing import Any

from labkit import progress
from labkit.flink import aim, checkpoints
from labkit.flink.consumed import EndWatch
from labkit.flink.outcome import FlinkJobError, flink_says
from labkit.flink.process import JobProcess
from labkit.flink.runsetup import START_S, RunSetup, Start
from labkit.kafka import topics
from labkit.kafka.inspect.client import InspectError, Inspector
from labkit.pipelines import data

GUARANTEES = ("exactly_once", "at_least_once")
DONE_S = 120.0  # the last start to the input's end, committed
MAX_FAILURES = 2  # starts that end by themselves (not killed) before the run gives up


class FlinkJob:
    """The job run until its input is consumed (see the module's docstring)."""

    def __init__(self, guarantee: str, *, interval_ms: int, timeout_ms: int, rate: float = 100.0,
                 stream_s: float = 2.0, steady_checkpoints: int = 0,
                 function: str = "fee_job", job_code: str | None = None):
        self.guarantee, self.interval_ms, self.timeout_ms = guarantee, interval_ms, timeout_ms
        self.rate, self.stream_s, self.steady = rate, stream_s, steady_checkpoints
        self.function, self.job_code = function, job_code
        self.setup: RunSetup | None = None
        self.job: JobProcess | None = None  # the start running now
        self.stop_payments = threading.Event()
        self._stopping = False

    def attach(self, run: Any) -> None:
        self.setup = _setup(run, self.guarantee, self.interval_ms, self.timeout_ms,
                            self.function, self.job_code)
        run.workers = self

    @property
    def starts(self) -> list[Start]:
        return self.setup.starts

    def kill_at(self, point: str, rng: random.Random) -> aim.Kill:
        """SIGKILL the running start at ``point`` of one of its next checkpoints."""
        s = self.setup
        return aim.kill_at(self.job, point, checkpoint_root=s.checkpoints, bootstrap=s.bootstrap,
                           prefix=s.prefix, output_topic=s.sink,
                           exactly_once=self.guarantee == "exactly_once",
                           interval_ms=self.interval_ms, rng=rng, timeout_s=START_S)

    def __call__(self, run: Any) -> None:
        s = self.setup
        _until_served(s.bootstrap, s.source, s.sink)
        failed: list[str] = []
        producer = threading.Thread(target=data.produce_at_rate, daemon=True, name="payments",
                                    args=(s.bootstrap, s.source, run.inputs, self.rate,
                                          self.stop_payments, failed))
        try:
            self._supervise(run, producer)
        finally:
            self.stop_payments.set()
            if self.job is not None:
                self.job.stop()
            if producer.is_alive():
                producer.join(30)
        if failed:
            raise RuntimeError(f"payments could not be produced: {failed[:3]}")
        written = {r.value["id"] for r in topics.read(s.bootstrap, s.source)}
        run.inputs = [p for p in run.inputs if p["id"] in written]

    def _supervise(self, run: Any, producer: threading.Thread) -> None:
        s = self.setup
        for _ in range(_most_starts(run)):
            with Inspector(s.bootstrap) as inspector:  # what the starts before this one wrote
                output_from = inspector.offsets(s.sink)[0].high_watermark
            self.job, restored = s.start()
            before = checkpoints.latest(s.checkpoints)
            took = s.first_checkpoint(self.job, before.id if before else 0)
            s.step(f"{self.job.name}: first checkpoint {took:.1f} s after its start")
            if not producer.is_alive() and not self.stop_payments.is_set():
                producer.start()
                s.step(f"payments arrive at {self.rate:g} a second")
                self._steady()
            run.event("checkpointed", start=len(s.starts) + 1)  # an aimed kill fires here
            if not self.job.alive:  # killed (and kept down) by the nemesis: restart it
                s.starts.append(Start(self.job.name, restored, s.now(), took, "killed"))
                self._stop_after_last_kill(run)
                continue
            self._stop_after_last_kill(run)
            ended = _until_consumed(s, self.job, producer, output_from)
            s.starts.append(Start(self.job.name, restored, s.now(), took, ended))
            if ended == "stopped":
                return
        raise FlinkJobError(self.job, f"the job failed {MAX_FAILURES + 1} times by itself")

    def _steady(self) -> None:
        """Let ``steady`` checkpoints complete after the job's first output before the first
        kill is aimed: what was visible before it is the latency of a job undisturbed
        (counted in checkpoints, not seconds: a busy machine checkpoints late)."""
        s = self.setup
        if not self.steady:
            return
        deadline = time.monotonic() + START_S
        with Inspector(s.bootstrap) as inspector:  # first its first output (a busy machine's
            while not inspector.offsets(s.sink)[0].high_watermark:  # first record is late)
                self._check_steady(deadline)
        until = checkpoints.latest(s.checkpoints).id + self.steady
        while checkpoints.latest(s.checkpoints).id < until:
            self._check_steady(deadline)
        s.step(f"{self.job.name}: {self.steady} checkpoints since its first output")

    def _check_steady(self, deadline: float) -> None:
        if not self.job.alive or time.monotonic() > deadline:
            raise FlinkJobError(self.job, f"no output and {self.steady} checkpoints within "
                                          f"{START_S:.0f} s of the payments")
        time.sleep(0.05)
        progress.beat("the job's steady checkpoints")

    def _stop_after_last_kill(self, run: Any) -> None:
        """Payments go on ``stream_s`` seconds after the last kill the nemesis has in store."""
        if self._stopping or any(k.kill is None for k in run.nemesis.of(aim.AimedKill)):
            return
        self._stopping = True
        timer = threading.Timer(self.stream_s, self.stop_payments.set)
        timer.daemon = True
        timer.start()


class RefusedStart:
    """The job started once, expected to fail by itself before its first checkpoint. Facts:
    ``flink_error`` (the root cause, as the job's failure reported it) and ``seconds`` (its
    start to its failure). Raises FlinkJobError if it completed a checkpoint instead."""

    def __init__(self, timeout_ms: int, function: str = "fee_job", job_code: str | None = None):
        self.timeout_ms, self.function, self.job_code = timeout_ms, function, job_code
        self.setup: RunSetup | None = None

    def attach(self, run: Any) -> None:
        self.setup = _setup(run, "exactly_once", 1000, self.timeout_ms, self.function,
                            self.job_code)

    def __call__(self, run: Any) -> None:
        job, _ = self.setup.start()
        with job:
            while (code := job.wait(0.2)) is None:
                if checkpoints.latest(self.setup.checkpoints) is not None:
                    break
                if time.monotonic() - job.started > START_S:
                    break
            if code is None or code == 0:
                raise FlinkJobError(job, f"transaction.timeout.ms={self.timeout_ms} was not "
                                         "refused: the job ran")
            said = flink_says(job) or job.log_tail(5)
            took = round(time.monotonic() - job.started, 1)
        self.setup.step(f"{job.name}: failed {took:.1f} s after its start: {said}")
        run.observe(flink_error=said, seconds=took)


def _setup(run: Any, guarantee: str, interval_ms: int, timeout_ms: int, function: str,
           job_code: str | None) -> RunSetup:
    # a folder of its own in the run's, per attempt (a run made again must not restore the
    # checkpoints of the one before)
    folder = run.workdir / f"job-{run.run_id}"
    folder.mkdir(parents=True, exist_ok=True)
    return RunSetup(run.bootstrap, source=run.topics["input"], sink=run.topics["output"],
                    group=run.group_id, prefix=run.transactional_id(), folder=folder,
                    guarantee=guarantee, interval_ms=interval_ms, timeout_ms=timeout_ms,
                    function=function, job_code=job_code,
                    step=lambda what: run.step(what, "the job"), clock=run.elapsed)


def _most_starts(run: Any) -> int:
    return len(run.nemesis.of(aim.AimedKill)) + 1 + MAX_FAILURES


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


def _until_consumed(s: RunSetup, job: JobProcess, producer: threading.Thread,
                    output_from: int) -> str:
    """Wait until the input is consumed (then stop the job: "stopped"), or the job ends by
    itself (Flink's error, the next start goes on from the latest checkpoint)."""
    deadline = time.monotonic() + DONE_S
    with Inspector(s.bootstrap) as inspector:
        end = EndWatch(inspector, s.source, s.sink, s.group, s.checkpoints, output_from)
        while producer.is_alive() or not end.done():
            if not job.alive:
                said = flink_says(job) or "it ended by itself"
                s.step(f"{job.name}: failed: {said}")
                return said
            if time.monotonic() > deadline:
                raise FlinkJobError(job, f"the input was not consumed {DONE_S:.0f} s after the "
                                         "last start")
            time.sleep(0.2)
    job.stop()
    s.step(f"{job.name}: the input is consumed and committed; the job is stopped")
    return "stopped"
