"""One start of a Flink job: a process of its own (PyFlink's Python and its JVM, the local
cluster, in one process group), that the lab can freeze, SIGKILL or stop.

    with JobProcess(code_file, "fee_job", params, run_dir, name="start-1") as job:
        job.alive, job.freeze(), job.thaw(), job.sigkill()
        job.outcome()      # {"ok": False, "java": ["...InvalidTxnTimeoutException: ..."]}

Leaving the ``with`` stops whatever is left of the group (SIGTERM, then SIGKILL): no JVM
outlives its job, on any path.
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from labkit import proc
from labkit.flink import environment

JOBMAIN = Path(__file__).with_name("jobmain.py")
FREEZE_WAIT_S = 2.0  # the most a freeze waits for every thread to show stopped
REFERENCE_JOB = Path(__file__).with_name("fee_job.py")


def job_command(code_file: Path, function: str, params: dict, run_dir: Path,
                name: str) -> tuple[list[str], dict[str, str]]:
    """How one start of a job is run: the command (PyFlink's python running jobmain with
    this start's settings file, written now) and its environment (``environment.child_env``:
    its Flink log and temporary files in ``run_dir/<name>-flink``)."""
    settings_file = run_dir / f"{name}.settings.json"
    settings_file.write_text(json.dumps({
        "code_file": str(code_file), "function": function, "params": params,
        "outcome_file": str(run_dir / f"{name}.outcome.json")}, indent=1))
    python = environment.python()
    env = environment.child_env(run_dir / f"{name}-flink", python)
    return [str(python), str(JOBMAIN), str(settings_file)], env


class JobProcess:
    def __init__(self, code_file: Path, function: str, params: dict, run_dir: Path,
                 name: str):
        self.name = name
        self.run_dir = run_dir
        self.log_file = run_dir / f"{name}.log"
        self.outcome_file = run_dir / f"{name}.outcome.json"
        command, env = job_command(code_file, function, params, run_dir, name)
        self.started = time.monotonic()
        with open(self.log_file, "w") as log:
            # group=True: the job leads a process group with its JVM (PyFlink's gateway is
            # started without a session of its own), so one signal reaches both.
            self.popen = proc.spawn(command, group=True, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, cwd=str(run_dir))
        self.killed_at: float | None = None

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def freeze(self) -> None:
        """SIGSTOP the whole group: Python, JVM, every thread stands still where it is. The
        signal reaches each thread when the kernel next schedules it, so this returns once
        every thread of the group shows stopped (a file write a thread was in the middle of
        is finished by then, and nothing after it starts)."""
        proc.signal_group(self.popen.pid, signal.SIGSTOP)
        pids = proc.group_members(self.popen.pid)
        deadline = time.monotonic() + FREEZE_WAIT_S
        while not proc.all_threads_stopped(pids) and time.monotonic() < deadline:
            time.sleep(0.001)

    def thaw(self) -> None:
        proc.signal_group(self.popen.pid, signal.SIGCONT)

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """Frozen for the block; thawed after it unless it was killed meanwhile."""
        self.freeze()
        try:
            yield
        finally:
            if self.alive:
                self.thaw()

    def sigkill(self) -> None:
        """The crash: SIGKILL the group (a frozen one too), and reap it."""
        self.killed_at = time.monotonic()
        proc.kill([self.popen], group=True)

    def stop(self) -> None:
        """The end of a run: SIGTERM, SIGKILL what is left 10 s later (frozen: thawed first)."""
        if self.alive:
            self.thaw()
        proc.stop([self.popen], timeout_s=10, group=True)

    def wait(self, timeout_s: float) -> int | None:
        """The exit code once it has ended by itself, None if still running after
        ``timeout_s``."""
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def outcome(self) -> dict | None:
        """What the job's function ended with (None if it was killed or still runs)."""
        try:
            return json.loads(self.outcome_file.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def __enter__(self) -> "JobProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
