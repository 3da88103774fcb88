"""A client part: a command under test run as a supervised process (a JVM, a script, an app
the lab did not write), the way ``labkit torture`` supervises its app.

    clients=lambda run: Command(lambda run: jvm.streams_app(...), environment, script)

The command runs as a process group of its own (a SIGKILL reaches everything it started: a
shell's java, a script's workers), its output in a log per start, its ``LABKIT {json}``
lines read back as its events, each start, kill and stop in the run's history. It is the
run's ``workers`` (one instance, 0), so the process faults of ``labkit.faults.process_faults``
(``Kill``, ``RandomKills``, ``Freeze``) break it as they break a worker pool: a kill is
followed by a new start on the same files, as a supervisor does. ``script(run, app)`` is
the experiment's order of things (wait for its progress, report the events faults wait
for, stop it); the app is stopped on every way out.
"""
from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit import proc, progress
from labkit.checking import history

PREFIX = "LABKIT "  # an event line: PREFIX then one JSON object
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long
LOG_TAIL_LINES = 15


class SupervisedCommand:
    """One command, started, killed, frozen and stopped as a process group (see the
    module's docstring). ``started_wall``: when its current start began (wall clock: the
    clock its events carry)."""

    def __init__(self, command: list[str], env: dict[str, str], workdir: Path,
                 history_file: Path | None = None, label: str = "the app"):
        self.command, self.env, self.workdir = command, env, workdir
        self.history_file, self.label = history_file, label
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.started_wall = 0.0
        self._started: float | None = None  # monotonic

    @property
    def log(self) -> Path:
        return self.workdir / f"app-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "wb") as out:
            self.started_wall, self._started = time.time(), time.monotonic()
            self.proc = proc.spawn(self.command, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=self.env, group=True)
        self._history("started", attempt=self.starts, pid=self.proc.pid)

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        """Is it running? A RuntimeError with its last lines if it exited by itself."""
        if self.poll() is not None:
            raise RuntimeError(f"{self.label} exited by itself (code {self.proc.returncode}); "
                               f"its last lines:\n{self.tail()}")
        return self.proc is not None

    def events(self) -> list[dict]:
        """This start's event lines so far (a line still being written is left for later)."""
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        found = []
        for line in lines:
            if line.startswith(PREFIX):
                try:
                    found.append(json.loads(line[len(PREFIX):]))
                except ValueError:
                    pass
        return found

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def stop(self) -> None:
        """SIGTERM the group (a chance to close cleanly), SIGKILL whatever is left."""
        if self.proc is None:
            return
        proc.stop([self.proc], STOP_GRACE_S, group=True)
        self._history("stopped", attempt=self.starts, code=self.proc.returncode)
        self.proc, self._started = None, None

    # ------------------------------------------------------------------ the nemesis's side
    # (labkit.faults.process_faults, as on a worker pool: one instance, 0)

    def kill(self, instance: int = 0) -> bool:
        """SIGKILL the whole group (nothing flushed, closed or committed), then start it
        again on the same files; was it running?"""
        if self.proc is None or self.proc.poll() is not None:
            return False
        proc.kill([self.proc], group=True)
        self._history("killed", attempt=self.starts)
        progress.check()  # a run its watchdog stopped starts nothing again
        self.start()
        return True

    def started_at(self, instance: int = 0) -> float | None:
        return self._started if self.proc is not None and self.proc.poll() is None else None

    def freeze(self, instance: int = 0) -> bool:
        return self._signal(signal.SIGSTOP)

    def thaw(self, instance: int = 0) -> bool:
        return self._signal(signal.SIGCONT)

    def frozen(self, instance: int = 0) -> bool:
        return self.proc is not None and proc.is_stopped(self.proc.pid)

    def _signal(self, signum: int) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        return proc.signal_group(self.proc.pid, signum)

    def _history(self, kind: str, **fields: Any) -> None:
        if self.history_file is not None:
            history.append(self.history_file, kind, **fields)

    def __enter__(self) -> "SupervisedCommand":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Command:
    """The client part: ``command(run)`` (argv) and ``env(run)`` make the process,
    ``script(run, app)`` drives it; the app is the run's ``workers`` while it runs."""

    def __init__(self, command: Callable[[Any], list[str]], env: Callable[[Any], dict],
                 script: Callable[[Any, SupervisedCommand], None], label: str = "the app"):
        self.command, self.env, self.script, self.label = command, env, script, label
        self.app: SupervisedCommand | None = None

    def attach(self, run: Any) -> None:
        self.app = SupervisedCommand(self.command(run), self.env(run), run.workdir,
                                     history_file=run.history_file, label=self.label)
        run.workers = self.app

    def __call__(self, run: Any) -> None:
        with self.app:
            self.script(run, self.app)
