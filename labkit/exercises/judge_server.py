"""A process per kernel that forks the capstone's judged runs, the judge already imported.

Started as a fresh process, each judged run spent about half a second of CPU importing the
judge (pandas, every experiment) before it ran anything: half of its own CPU, and ten of them
a verdict (docs/measurements.md, stop 58). This server imports it once, at its start (``PRELOAD``), and
forks a run per request (``target(argument)``, a ``module:function`` name as the crash runner
takes); the fork shares those pages and starts in milliseconds.

The server is single-threaded (forking a process with threads copies locks some thread
held), and its own process group: a terminal's Ctrl-C does not reach it. It dies with the
process that started it, and each run it forks dies with it (Linux's parent-death signal):
no judged run outlives the kernel, however the kernel ends. A forked run leads a session of
its own (cancelling it reaches what it started), writes its output to its log and, once the
server has reaped it, its exit code to ``<dir>/returncode``: the server, not the kernel, is
its parent.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import psutil

from labkit import proc

REPLY_TIMEOUT_S = 60.0  # the server's start (its imports) on a loaded machine, then a fork
GONE_GRACE_S = 2.0  # a run found gone: how long its exit code may take to be written
KILLED = -signal.SIGKILL  # a run gone without an exit code: killed with its server
# imported (and called, with ":") once by the server: the judge, every experiment
PRELOAD = ("labkit.exercises.side_by_side", "labkit.experiments.registry:catalog")


class Forked:
    """A judged run the server forked: the part of ``subprocess.Popen`` a run's owner uses."""

    def __init__(self, pid: int, run_dir: Path):
        self.pid = pid
        self.returncode: int | None = None
        self._status = run_dir / "returncode"
        try:  # signals go to this process, never to a later one given the same pid
            self.leader: psutil.Process | None = psutil.Process(pid)
        except psutil.NoSuchProcess:
            self.leader = None
        self._gone_at: float | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self._status.exists():
            self.returncode = int(self._status.read_text())
        elif not self._running():
            self._gone_at = self._gone_at or time.monotonic()
            if time.monotonic() - self._gone_at > GONE_GRACE_S:
                self.returncode = KILLED
        return self.returncode

    def _running(self) -> bool:
        try:
            return self.leader is not None and self.leader.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.05)
        return self.returncode


class _Client:
    """The kernel's end: starts the server on first use (again if it died) and asks it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._server = None

    def fork(self, target: str, argument: object, run_dir: Path, keep_fd: int) -> Forked:
        """Fork a run of ``target(argument)`` (``module:function``, the argument JSON) that
        logs to ``run_dir``/run.log and holds ``keep_fd`` (its slot's lock) as long as it
        lives."""
        request = {"target": target, "argument": argument, "dir": str(run_dir),
                   "cwd": os.getcwd(), "env": dict(os.environ)}
        with self._lock:
            for attempt in (1, 2):  # a server that died (killed) is started again, once
                try:
                    if self._server is None or self._server.poll() is not None:
                        self._start()
                    socket.send_fds(self._sock, [json.dumps(request).encode() + b"\n"],
                                    [keep_fd])
                    return Forked(int(self._reply()), run_dir)
                except (OSError, ValueError):
                    self._close()
                    if attempt == 2:
                        raise

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self._server = proc.spawn([sys.executable, "-m", "labkit.exercises.judge_server",
                                   str(theirs.fileno()), *PRELOAD], group=True, pass_fds=(theirs.fileno(),),
                                  stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        ours.settimeout(REPLY_TIMEOUT_S)
        self._sock, self._reader = ours, ours.makefile("rb")
        if self._reply() != "ready":
            raise OSError("the judge server did not start")

    def _reply(self) -> str:
        line = self._reader.readline()
        if not line:
            raise OSError("the judge server ended")
        return line.decode().strip()

    def _close(self) -> None:
        if self._server is not None:
            proc.kill([self._server])
        if self._sock is not None:
            self._sock.close()
        self._sock = self._server = None


CLIENT = _Client()


# --------------------------------------------------------------------------- the server


def _serve(sock: socket.socket) -> dict | None:
    """Fork a run per request until the kernel's end closes; in a forked run, its request."""
    runs: dict[int, Path] = {}
    ended: dict[int, int] = {}

    def reap(*_: object) -> None:
        ended.update(proc.reap_forked())
        _write_status(runs, ended)

    signal.signal(signal.SIGCHLD, reap)
    while True:
        line, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        if not line:
            return None  # the kernel's end is closed
        while not line.endswith(b"\n"):  # a request longer than one read
            more = sock.recv(1 << 16)
            if not more:
                return None
            line += more
        request = json.loads(line)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # reaped once it is known
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the run reaps its own children
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            sock.close()
            return request  # it keeps the fds it was sent (its slot's lock) till it ends
        for fd in fds:
            os.close(fd)
        runs[pid] = Path(request["dir"])
        _write_status(runs, ended)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        sock.sendall(f"{pid}\n".encode())


def _write_status(runs: dict[int, Path], ended: dict[int, int]) -> None:
    for pid in [p for p in ended if p in runs]:
        run_dir, code = runs.pop(pid), ended.pop(pid)
        partial = run_dir / "returncode.part"
        try:
            partial.write_text(str(code))
            partial.rename(run_dir / "returncode")  # read whole or not at all
        except OSError:
            pass  # its directory is gone: nobody waits for it


def _run(request: dict) -> int:
    """In the forked run: the kernel's environment and directory, its own session and log."""
    os.setsid()
    proc.die_with_parent()  # the server: which dies with the kernel
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]
    log = os.open(Path(request["dir"]) / "run.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    try:
        _named(request["target"])(request["argument"])
        return 0
    except KeyboardInterrupt:
        return 130
    except BaseException:
        traceback.print_exc()
        return 1


def _named(target: str):
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only its runs take a learner's interrupt
    for name in sys.argv[2:]:
        _named(name)() if ":" in name else importlib.import_module(name)
    sock.sendall(b"ready\n")
    request = _serve(sock)
    if request is None:
        return  # the kernel is gone: so are its runs (they die with this process)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(_run(request))  # the interpreter's exit flushes the log, runs atexit


if __name__ == "__main__":
    main()
