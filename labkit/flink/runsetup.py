"""One run of a Flink job: the names the run gave it (topics, group, transactional id
prefix), its folder (the run's: checkpoints, each start's settings, output and Flink log),
the parameters its job function is called with, and each start of the job (fresh, or
restoring the latest completed checkpoint)."""
from __future__ import annotations

import ast
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labkit import progress
from labkit.flink import checkpoints
from labkit.flink import environment
from labkit.flink.outcome import FlinkJobError
from labkit.flink.process import REFERENCE_JOB, JobProcess
from labkit.kafka import javaconfig

# What a job function may ask for by name (the lab's fee_job asks for all of it).
JOB_PROVIDES = ("bootstrap", "input_topic", "output_topic", "group_id",
                "transactional_id_prefix", "delivery_guarantee", "checkpoint_dir",
                "checkpoint_interval_ms", "transaction_timeout_ms", "restore_from",
                "connector_jars", "kafka_properties")
START_S = 120.0  # a job's start to its first checkpoint (about 8 s on an idle 2-core machine)


@dataclass(frozen=True)
class Start:
    name: str
    restored_from: str | None  # the checkpoint folder it restored (None: a fresh start)
    started_s: float  # since the run began
    first_checkpoint_s: float | None  # its start to its first completed checkpoint
    ended: str  # "killed", "stopped", or Flink's error


def check_job(code: str, function: str) -> None:
    """A job's code, checked without running it (PyFlink is not importable here): it must
    parse, define ``function``, and ask only for what the lab provides (JOB_PROVIDES)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise ValueError(f"the job's code does not parse: {exc}") from None
    defined = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if function not in defined:
        raise ValueError(f"the job's code defines no function {function!r} (it defines "
                         f"{', '.join(defined) or 'none'})")
    args = defined[function].args
    required = [a.arg for a in args.args[:len(args.args) - len(args.defaults)]]
    unknown = [a for a in required if a not in JOB_PROVIDES]
    if unknown:
        raise ValueError(f"{function} asks for {', '.join(unknown)}, which the lab does not "
                         f"provide; it provides {', '.join(JOB_PROVIDES)}")


class RunSetup:
    """One run's job: its code (checked before anything starts), the parameters it is called
    with (the run's names and folder), its starts and the steps it reports (``step``, the
    run's timeline; ``clock``, seconds since the run began)."""

    def __init__(self, bootstrap: str, *, source: str, sink: str, group: str, prefix: str,
                 folder: Path, guarantee: str, interval_ms: int, timeout_ms: int,
                 function: str = "fee_job", job_file: Path | None = None,
                 job_code: str | None = None,
                 step: Callable[[str], None] = progress.step,
                 clock: Callable[[], float] = lambda: 0.0):
        code = job_code if job_code is not None else Path(job_file or REFERENCE_JOB).read_text()
        check_job(code, function)  # before anything starts
        environment.python()  # PyFlink's environment: created now if new, not in a start
        jars = [p.as_uri() for p in environment.connector_jars()]
        self.bootstrap, self.source, self.sink, self.group, self.prefix = (
            bootstrap, source, sink, group, prefix)
        self.dir = folder
        self.checkpoints = self.dir / "checkpoints"
        self.function = function
        self.job_file = Path(job_file or REFERENCE_JOB)
        if job_code is not None:  # a learner's cell: the job's process runs it from a file
            self.job_file = self.dir / "job.py"
            self.job_file.write_text(job_code)
        self.params = {
            "bootstrap": bootstrap, "input_topic": source, "output_topic": sink,
            "group_id": group, "transactional_id_prefix": prefix,
            "delivery_guarantee": guarantee, "checkpoint_dir": self.checkpoints.as_uri(),
            "checkpoint_interval_ms": interval_ms, "transaction_timeout_ms": timeout_ms,
            "restore_from": None,
            "connector_jars": jars,
            "kafka_properties": javaconfig.for_client(bootstrap)}
        self.step, self.now = step, clock
        self.starts: list[Start] = []

    def start(self) -> tuple[JobProcess, str | None]:
        last = checkpoints.latest(self.checkpoints)
        restore = str(last.path) if last else None
        name = f"start-{len(self.starts) + 1}"
        job = JobProcess(self.job_file, self.function, {**self.params, "restore_from": restore},
                         self.dir, name)
        self.step(f"{name}: the job starts " + (f"from checkpoint {last.id}" if last
                                                else "fresh (no checkpoint yet)"))
        return job, restore

    def first_checkpoint(self, job: JobProcess, after: int) -> float:
        """Wait for the job's first completed checkpoint (an id above ``after``)."""
        deadline = time.monotonic() + START_S
        while True:
            last = checkpoints.latest(self.checkpoints)
            if last is not None and last.id > after:
                return round(time.monotonic() - job.started, 1)
            if not job.alive:
                raise FlinkJobError(job, "the job ended before its first checkpoint")
            if time.monotonic() > deadline:
                raise FlinkJobError(job, f"no checkpoint {START_S:.0f} s after the start")
            time.sleep(0.05)

