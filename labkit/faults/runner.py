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
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit import proc

from labkit.checking import history
from labkit.faults import crashpoints
from labkit.progress import beat, check, status, step

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
    kills: int = 0  # SIGKILLs sent at random times (``kills`` of run_workers)

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
               max_attempts: int = 4, timeout_s: float = 300.0, label: str | None = None,
               history_file: str | None = None,
               on_crash: Callable[[], None] | None = None) -> RunResult:
    """Run ``worker(**kwargs)`` in a child process until it finishes, crashing it once.
    ``on_crash`` runs after the armed crash killed it and before the restart (the world
    changing while the worker is down, e.g. a lookup table edited).

    Raises UnknownCrashPoint for a bad ``crash_at`` (listing the valid ones) and WorkerFailed
    if an attempt exits with an error, times out, or the worker never finishes.
    """
    return run_workers(worker, [kwargs], crash_at, hit, max_attempts=max_attempts,
                       timeout_s=timeout_s, label=label, history_file=history_file,
                       on_crash=on_crash)


def run_workers(worker: Callable | str, instances: list[dict], crash_at: str | None = None,
                hit: int = 1, crash_instance: int = 0, max_attempts: int = 4,
                timeout_s: float = 300.0, label: str | None = None,
                history_file: str | None = None, kills: int = 0,
                kill_after_s: tuple[float, float] = (1.0, 4.0), seed: int = 0,
                on_crash: Callable[[], None] | None = None) -> RunResult:
    """Run one child process per entry of ``instances`` (each ``worker``'s kwargs) at once,
    as N instances of one application; crash instance ``crash_instance`` at ``crash_at``
    and restart every crashed instance, like a supervisor, until all have finished.

    ``kills``: also SIGKILL instance ``crash_instance`` that many times, each a random time
    (``kill_after_s``, seeded) after it (re)started, wherever its code happens to be.

    ``exit_codes`` and ``durations_s`` list every attempt of every instance in the order
    they ended; ``attempts`` counts them all.
    """
    crash_env = crashpoints.arm(crash_at, hit)  # validates the name and hit first
    if not 0 <= crash_instance < len(instances):
        raise ValueError(f"crash_instance must be between 0 and {len(instances) - 1}, "
                         f"not {crash_instance}")
    target = target_name(worker)
    payloads = [_payload(kwargs) for kwargs in instances]
    result = RunResult(target=target, crash_at=crash_at, hit=hit)
    label = label or target
    started = time.monotonic()
    attempts = [0] * len(instances)
    max_attempts = max(max_attempts, kills + 2)
    rng = random.Random(seed)
    kill_due: float | None = None
    # The progress line is shown for every run, not only slow ones, so that a notebook's
    # output does not depend on how fast the machine was.
    with status(f"Running {label}") as progress, \
            tempfile.TemporaryDirectory(prefix="labkit-worker-") as logs, \
            _Children() as children:
        def start(i: int) -> None:
            nonlocal kill_due
            check()  # a run its watchdog stopped restarts nothing
            attempts[i] += 1
            result.attempts += 1
            if i == crash_instance and result.kills < kills:
                kill_due = time.monotonic() + rng.uniform(*kill_after_s)
            armed = crash_env if attempts[i] == 1 and i == crash_instance else {}
            children.start(i, target, payloads[i], Path(logs) / f"instance-{i}-attempt-{attempts[i]}.log",
                           _child_env(armed, i, history_file, attempts[i]))
            step(f"{label}: instance {i} started (attempt {attempts[i]})",
                 f"instance {i} to process its input")

        logged = _Growth(history_file)

        for i in range(len(instances)):
            start(i)
        while children.running:
            if time.monotonic() - started > timeout_s:
                raise WorkerFailed(f"{label}: did not finish within {timeout_s:.0f} s"
                                   f"\n{children.tails()}")
            if kill_due is not None and time.monotonic() >= kill_due:
                kill_due = None
                if children.kill(crash_instance):
                    result.kills += 1
            if logged.grew():  # a worker logged a batch: progress, for the watchdog
                beat("the workers' next batch")
            for i, code, seconds, log in children.reap():
                step(f"{label}: instance {i} exited with code {code}", "the other instances")
                result.exit_codes.append(code)
                result.durations_s.append(seconds)
                if history_file:
                    history.append(history_file, "exited", instance=str(i), attempt=attempts[i],
                                   code=code)
                if code == 0:
                    continue
                if code != crashpoints.CRASH_EXIT_CODE:
                    raise WorkerFailed(f"{label}: instance {i} attempt {attempts[i]} exited with "
                                       f"code {code}\n{_tail(log)}")
                if attempts[i] == 1 and i == crash_instance and crash_at:
                    result.crashed = True
                    if on_crash is not None:  # while it is down, before the restart
                        on_crash()
                if attempts[i] >= max_attempts:
                    raise WorkerFailed(f"{label}: killed {attempts[i]} times, giving up")
                where = crash_at if attempts[i] == 1 and i == crash_instance and crash_at \
                    else "a random time"
                who = f" instance {i}" if len(instances) > 1 else ""
                progress(f"{label}:{who} killed at {where}, restarting (attempt {attempts[i] + 1})")
                start(i)
            time.sleep(0.05)
    result.total_s = round(time.monotonic() - started, 3)
    return result


@dataclass
class ZombieResult:
    """The stalled instance's and its successor's exit codes, and the stall's length."""

    zombie_exit: int
    successor_exit: int
    stalled_s: float


def run_zombie(worker: Callable | str, zombie: dict, successor: dict, stall_at: str,
               hit: int = 1, timeout_s: float = 300.0, label: str | None = None,
               history_file: str | None = None) -> ZombieResult:
    """The zombie experiment: instance A freezes (SIGSTOP) at ``stall_at``; B starts and
    runs to the end while A is frozen; then A is woken (SIGCONT) and runs to its end."""
    stall_env = crashpoints.arm(stall_at, hit, stall=True)
    target = target_name(worker)
    label = label or target
    with status(f"Running {label}") as progress, \
            tempfile.TemporaryDirectory(prefix="labkit-worker-") as logs, \
            _Children() as children:
        children.start(0, target, _payload(zombie), Path(logs) / "zombie.log",
                       _child_env(stall_env, 0, history_file))
        children.wait_stopped(0, timeout_s)
        stalled = time.monotonic()
        progress(f"{label}: instance 0 frozen at {stall_at}; instance 1 takes over")
        children.start(1, target, _payload(successor), Path(logs) / "successor.log",
                       _child_env({}, 1, history_file))
        successor_exit = children.wait(1, timeout_s)
        progress(f"{label}: instance 1 done; waking instance 0")
        stalled_s = round(time.monotonic() - stalled, 3)
        children.resume(0)
        zombie_exit = children.wait(0, timeout_s)
        for code, which in ((successor_exit, 1), (zombie_exit, 0)):
            if code != 0:
                raise WorkerFailed(f"{label}: instance {which} exited with code {code}"
                                   f"\n{children.tails()}")
    return ZombieResult(zombie_exit, successor_exit, stalled_s)


def run_frozen(worker: Callable | str, kwargs: dict, stall_at: str, frozen_s: float,
               hit: int = 1, timeout_s: float = 300.0, label: str | None = None,
               history_file: str | None = None) -> float:
    """One instance freezes (SIGSTOP) at ``stall_at``, stays frozen ``frozen_s`` (its
    connections open, its heartbeats stopped: a long GC pause), is woken (SIGCONT) and runs
    to its end. Returns how long it really stayed frozen."""
    stall_env = crashpoints.arm(stall_at, hit, stall=True)
    target = target_name(worker)
    label = label or target
    with status(f"Running {label}") as progress, \
            tempfile.TemporaryDirectory(prefix="labkit-worker-") as logs, \
            _Children() as children:
        children.start(0, target, _payload(kwargs), Path(logs) / "frozen.log",
                       _child_env(stall_env, 0, history_file))
        children.wait_stopped(0, timeout_s)
        stalled = time.monotonic()
        progress(f"{label}: instance 0 frozen at {stall_at} for {frozen_s:g} s")
        time.sleep(frozen_s)
        frozen = round(time.monotonic() - stalled, 3)
        children.resume(0)
        code = children.wait(0, timeout_s)
        if code != 0:
            raise WorkerFailed(f"{label}: instance 0 exited with code {code}\n{children.tails()}")
    return frozen


def _payload(kwargs: dict) -> bytes:
    try:
        return json.dumps(kwargs).encode()
    except TypeError as exc:
        raise ValueError(f"worker arguments must be JSON-able plain data: {exc}") from None


def _child_env(armed: dict[str, str], instance: int, history_file: str | None,
               attempt: int = 1) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in crashpoints.ENV_VARS and k != history.ENV_FILE}
    env.update(armed)
    env[history.ENV_INSTANCE] = str(instance)
    env[history.ENV_ATTEMPT] = str(attempt)
    if history_file:
        env[history.ENV_FILE] = str(history_file)
    return env


class _Children:
    """The worker processes of one run; every one still alive is killed on the way out."""

    def __init__(self):
        self.procs: dict[int, tuple[subprocess.Popen, float, Path]] = {}
        self.logs: list[Path] = []

    @property
    def running(self) -> bool:
        return bool(self.procs)

    def start(self, i: int, target: str, payload: bytes, log: Path, env: dict[str, str]) -> None:
        with open(log, "wb") as out:
            child = proc.spawn([sys.executable, "-m", "labkit.faults.runner", target],
                               stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env)
        # registered before it is fed: if feeding fails, __exit__ still stops it
        self.procs[i] = (child, time.monotonic(), log)
        self.logs.append(log)
        child.stdin.write(payload)
        child.stdin.close()

    def reap(self) -> list[tuple[int, int, float, Path]]:
        """(instance, exit code, seconds, log) of every child that has ended since last asked."""
        ended = []
        for i, (child, t0, log) in list(self.procs.items()):
            code = child.poll()
            if code is not None:
                del self.procs[i]
                ended.append((i, code, round(time.monotonic() - t0, 3), log))
        return ended

    def wait(self, i: int, timeout_s: float) -> int:
        child, _, _ = self.procs.pop(i)
        try:
            return child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill([child])
            raise WorkerFailed(f"instance {i} did not finish within {timeout_s:.0f} s"
                               f"\n{self.tails()}") from None

    def wait_stopped(self, i: int, timeout_s: float) -> None:
        child = self.procs[i][0]
        deadline = time.monotonic() + timeout_s
        while not proc.is_stopped(child.pid):
            if child.poll() is not None or time.monotonic() > deadline:
                raise WorkerFailed(f"instance {i} never reached its stall point"
                                   f"\n{self.tails()}")
            time.sleep(0.05)

    def kill(self, i: int) -> bool:
        """SIGKILL instance ``i`` if it is running; was it?"""
        if i not in self.procs or self.procs[i][0].poll() is not None:
            return False
        self.procs[i][0].kill()
        return True

    def resume(self, i: int) -> None:
        self.procs[i][0].send_signal(signal.SIGCONT)

    def tails(self) -> str:
        return "\n".join(f"{log.name}:\n{_tail(log)}" for log in self.logs if log.exists())

    def __enter__(self) -> "_Children":
        return self

    def __exit__(self, *exc) -> None:
        # a timeout, an error, Ctrl-C / an interrupt: SIGKILL (it also ends a stopped
        # process) to each worker and whatever it started
        proc.kill([child for child, _, _ in self.procs.values()])
        self.procs.clear()


def _tail(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return "\n".join(f"  | {line}" for line in lines)


def _main(target: str) -> None:
    """Child side: import the worker, read its kwargs from stdin, run it."""
    module, _, func = target.partition(":")
    worker = getattr(importlib.import_module(module), func)
    kwargs = json.loads(sys.stdin.read())
    # then e.g. fire-and-forget writes reach the log (labkit.pipelines.common.DeliveryTracker.drain)
    crashpoints.run_as_worker(lambda: worker(**kwargs))


if __name__ == "__main__":
    _main(sys.argv[1])


class _Growth:
    """Whether a file grew since the last look (a missing file has size 0)."""

    def __init__(self, path: str | None):
        self.path, self.size = path, 0

    def grew(self) -> bool:
        if self.path is None:
            return False
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return False
        grew, self.size = size > self.size, size
        return grew
