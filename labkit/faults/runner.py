"""Run a worker as a real child process, crash it at a named point, restart it like a supervisor.

    result = run_worker(ctp.run, dict(bootstrap=..., ...), crash_at="after-commit", hit=2)
    result.crashed, result.attempts, result.exit_codes      # True, 2, [-9, 0]

The worker is a module-level function called with JSON-able keyword arguments in a fresh
``python -m labkit.faults.runner`` process. The first attempt has the crash point armed
(``crashpoints.arm``); when it dies by SIGKILL there, the worker is started again with the
same arguments and nothing armed, so it resumes from whatever it had committed, as a
process supervisor (systemd, Kubernetes) would restart it, until it finishes.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.cluster import die_with_owner
from labkit.faults import crashpoints
from labkit.progress import status

LOG_TAIL_LINES = 25


class WorkerFailed(RuntimeError):
    """The worker exited with an error (not the armed crash); the message has its log tail."""


@dataclass
class RunResult:
    """What the supervisor saw: plain data, for tables and the measurement docs."""

    target: str
    crash_at: str | None
    hit: int
    attempts: int = 0
    crashed: bool = False  # did the armed crash point fire?
    exit_codes: list[int] = field(default_factory=list)  # -9 is SIGKILL
    durations_s: list[float] = field(default_factory=list)  # wall time of each attempt
    total_s: float = 0.0

    @property
    def restart_s(self) -> float | None:
        """Wall time of the attempts after the crash (start, recover, finish the rest)."""
        return sum(self.durations_s[1:]) if self.crashed else None

    def to_dict(self) -> dict:
        return {**asdict(self), "restart_s": self.restart_s}


def target_name(worker: Callable | str) -> str:
    """``"package.module:function"`` for a module-level function (a child must import it)."""
    if isinstance(worker, str):
        module, _, func = worker.partition(":")
        if not module or not func:
            raise ValueError(f"worker {worker!r} must look like 'package.module:function'")
        return worker
    module, qualname = getattr(worker, "__module__", None), getattr(worker, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname or "." in qualname:
        raise ValueError(f"worker {worker!r} must be a module-level function in an importable "
                         "module (not a lambda, a closure, a method or defined in __main__), "
                         "because it runs in a separate process")
    return f"{module}:{qualname}"


def run_worker(worker: Callable | str, kwargs: dict, crash_at: str | None = None, hit: int = 1,
               max_attempts: int = 4, timeout_s: float = 300.0, label: str | None = None) -> RunResult:
    """Run ``worker(**kwargs)`` in a child process until it finishes, crashing it once.

    Raises UnknownCrashPoint for a bad ``crash_at`` (listing the valid ones) and WorkerFailed
    if an attempt exits with an error, times out, or the worker never finishes.
    """
    crash_env = crashpoints.arm(crash_at, hit)  # validates the name and hit first
    target = target_name(worker)
    try:
        payload = json.dumps(kwargs)
    except TypeError as exc:
        raise ValueError(f"worker arguments must be JSON-able plain data: {exc}") from None
    result = RunResult(target=target, crash_at=crash_at, hit=hit)
    label = label or target
    started = time.monotonic()
    # The progress line is shown for every run, not only slow ones, so that a notebook's
    # output does not depend on how fast the machine was.
    with status(f"Running {label}") as progress, \
            tempfile.TemporaryDirectory(prefix="labkit-worker-") as logs:
        while True:
            result.attempts += 1
            env = {k: v for k, v in os.environ.items()
                   if k not in (crashpoints.ENV_POINT, crashpoints.ENV_HIT)}
            if result.attempts == 1:
                env.update(crash_env)
            log = Path(logs) / f"attempt-{result.attempts}.log"
            t0 = time.monotonic()
            with open(log, "wb") as out:
                proc = subprocess.Popen([sys.executable, "-m", "labkit.faults.runner", target],
                                        stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                        env=env, preexec_fn=die_with_owner())
            proc.stdin.write(payload.encode())
            proc.stdin.close()
            try:
                code = proc.wait(timeout=timeout_s)
            except BaseException as exc:  # a timeout, or Ctrl-C / a notebook interrupt
                proc.kill()
                proc.wait()
                if isinstance(exc, subprocess.TimeoutExpired):
                    raise WorkerFailed(f"{label}: attempt {result.attempts} did not finish "
                                       f"within {timeout_s:.0f} s\n{_tail(log)}") from None
                raise
            result.exit_codes.append(code)
            result.durations_s.append(round(time.monotonic() - t0, 3))
            if code == 0:
                break
            if code != crashpoints.CRASH_EXIT_CODE:
                raise WorkerFailed(f"{label}: attempt {result.attempts} exited with code {code}"
                                   f"\n{_tail(log)}")
            if result.attempts == 1 and crash_at:
                result.crashed = True
            if result.attempts >= max_attempts:
                raise WorkerFailed(f"{label}: killed {result.attempts} times, giving up")
            where = crash_at or "an unarmed SIGKILL"
            progress(f"{label}: killed at {where}, restarting (attempt {result.attempts + 1})")
    result.total_s = round(time.monotonic() - started, 3)
    return result


def _tail(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return "\n".join(f"  | {line}" for line in lines)


def _main(target: str) -> None:
    """Child side: import the worker, read its kwargs from stdin, run it."""
    module, _, func = target.partition(":")
    worker = getattr(importlib.import_module(module), func)
    worker(**json.loads(sys.stdin.read()))


if __name__ == "__main__":
    _main(sys.argv[1])
