"""The processes of one supervised run (``labkit.faults.pool``): started with their logs,
signalled, reaped, and every one still alive killed on the way out, whatever happened; what
they report read back as they write it (the workers' history file, an app's event lines)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from labkit import forkserver, proc

LOG_TAIL_LINES = 25
EVENT_PREFIX = "LABKIT "  # an app's event line in its log: the prefix, then one JSON object


class StartFailed(RuntimeError):
    """A process could not be started (no such command, not executable)."""


class Children:
    """The processes of one run; every one still alive is killed on the way out (with
    ``group``, each leads a process group, and the whole group is signalled)."""

    def __init__(self, logs: Path, group: bool = False):
        self.logs_dir, self.group = logs, group
        self.procs: dict[int, tuple[subprocess.Popen | forkserver.Forked, float, Path]] = {}
        self.logs: list[Path] = []
        self.last_log: dict[int, Path] = {}

    @property
    def running(self) -> bool:
        return bool(self.procs)

    def start(self, i: int, argv: list[str], data: bytes | None, log_name: str,
              env: dict[str, str]) -> int:
        log = self.logs_dir / log_name
        with open(log, "wb") as out:
            try:
                child = proc.spawn(argv, stdin=subprocess.PIPE if data is not None
                                   else subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=env, group=self.group)
            except OSError as exc:
                raise StartFailed(f"cannot start {argv[0]!r}: {exc}") from None
        # registered before it is fed: if feeding fails, __exit__ still stops it
        self.procs[i] = (child, time.monotonic(), log)
        self.logs.append(log)
        self.last_log[i] = log
        if data is not None:
            child.stdin.write(data)
            child.stdin.close()
        return child.pid

    def start_worker(self, i: int, target: str, kwargs: dict, log_name: str,
                     env: dict[str, str]) -> int:
        """Instance ``i`` running ``target(**kwargs)`` (``labkit.faults.runner``): forked from
        this process's own server if it has one (``labkit.forkserver.LOCAL``, a judged run's:
        the runner and confluent_kafka imported, so it starts in milliseconds), else a fresh
        ``python -m``."""
        if forkserver.LOCAL is None:
            argv = [sys.executable, "-m", "labkit.faults.runner", target]
            return self.start(i, argv, json.dumps(kwargs).encode(), log_name, env)
        log = self.logs_dir / log_name
        child = forkserver.LOCAL.fork("labkit.faults.runner:run_forked",
                                      {"target": target, "kwargs": kwargs}, log=log,
                                      status=log.with_name(log.name + ".returncode"), env=env,
                                      session=False)
        self.procs[i] = (child, time.monotonic(), log)
        self.logs.append(log)
        self.last_log[i] = log
        return child.pid

    def reap(self) -> list[tuple[int, int, float, Path]]:
        """(instance, exit code, seconds, log) of every child that has ended since last asked."""
        ended = []
        for i, (child, t0, log) in list(self.procs.items()):
            code = child.poll()
            if code is not None:
                del self.procs[i]
                if self.group:  # whatever it started in its group goes with it
                    proc.kill([_signalled(child)], group=True)
                ended.append((i, code, round(time.monotonic() - t0, 3), log))
        return ended

    def pids(self) -> dict[int, int]:
        """Each running instance's process id (with ``group``, its process group's)."""
        return {i: child.pid for i, (child, _, _) in self.procs.items() if child.poll() is None}

    def alive(self, i: int) -> bool:
        return i in self.procs and self.procs[i][0].poll() is None

    def stopped(self, i: int) -> bool:
        return self.alive(i) and proc.is_stopped(self.procs[i][0].pid)

    def kill(self, i: int) -> bool:
        """SIGKILL instance ``i`` (its group) if it is running; was it?"""
        if not self.alive(i):
            return False
        proc.kill([_signalled(self.procs[i][0])], group=self.group)
        return True

    def signal(self, i: int, signum: int) -> bool:
        if not self.alive(i):
            return False
        child = self.procs[i][0]
        if self.group:
            proc.signal_group(child.pid, signum)
        else:
            child.send_signal(signum)
        return True

    def terminate(self, i: int, grace_s: float) -> None:
        if i in self.procs:
            child = self.procs[i][0]
            threading.Thread(target=proc.stop, args=([_signalled(child)], grace_s),
                             kwargs={"group": self.group}, daemon=True).start()

    def stop_all(self, grace_s: float) -> None:
        """SIGTERM every one (and its group), SIGKILL what is left after ``grace_s``; the
        loop reaps them."""
        # a copy first (one call, atomic): the supervision's thread may reap meanwhile
        procs = list(self.procs.values())
        proc.stop([_signalled(child) for child, _, _ in procs], grace_s, group=self.group)

    def tail(self, i: int) -> str:
        log = self.last_log.get(i)
        return tail_of(log) if log is not None and log.exists() else ""

    def tails(self) -> str:
        return "\n".join(f"{log.name}:\n{tail_of(log)}" for log in self.logs if log.exists())

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, *exc) -> None:
        # a timeout, an error, Ctrl-C / an interrupt: SIGKILL (it also ends a stopped
        # process) to each worker and whatever it started
        proc.kill([_signalled(child) for child, _, _ in self.procs.values()], group=self.group)
        self.procs.clear()


def _signalled(child: subprocess.Popen | forkserver.Forked) -> object:
    """What ``labkit.proc`` signals for a child: its Popen, or a forked one's process."""
    return child.leader if isinstance(child, forkserver.Forked) else child


@contextmanager
def logs_dir(kept: Path | None) -> Iterator[Path]:
    """Where each attempt's log goes: ``kept`` (it stays), or a directory removed after."""
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
        yield kept
        return
    with tempfile.TemporaryDirectory(prefix="labkit-worker-") as logs:
        yield Path(logs)


def tail_of(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    return "\n".join(f"  | {line}" for line in lines)


class _Tail:
    """The complete lines appended to a file since the last look (a line still being
    written waits for the next)."""

    def __init__(self, path: str | Path | None):
        self.path, self.offset = path, 0

    def lines(self) -> list[bytes]:
        if self.path is None or not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return complete.splitlines()


class HistoryTail(_Tail):
    """The history events appended to a file since the last look (none without a file)."""

    def new(self) -> list[dict]:
        return [json.loads(line) for line in self.lines() if line.strip()]


class EventLines(_Tail):
    """The events an app prints to its log since the last look: each line ``LABKIT {json}``
    (a JSON object, e.g. ``{"event": "restore-end", "at_ms": ...}``); other lines skipped."""

    def new(self) -> list[dict]:
        prefix, found = EVENT_PREFIX.encode(), []
        for line in self.lines():
            if line.startswith(prefix):
                try:
                    event = json.loads(line[len(prefix):])
                except ValueError:  # not one JSON object: the app's own text
                    continue
                if isinstance(event, dict):
                    found.append(event)
        return found
