"""A single-threaded process that forks children with its modules already imported.

A fresh Python process spends most of a short life importing (the judge: pandas and every
experiment; a loop's instance: confluent_kafka and the runner). A fork server imports them
once and forks a child per request (``target(argument)``, a ``module:function`` name); the
fork shares those pages and starts in milliseconds (docs/measurements.md, stops 58 and 59).

The server is single-threaded: forking a process with threads copies locks some thread
held. It dies with the process that started it, and each child dies with it (Linux's
parent-death signal). A child leads a session of its own (a cancel reaches what it
started) unless asked not to, runs with the requester's environment and directory, logs to
the file it was given and, once the server has reaped it, has its exit code written to
``status`` (the server, not the requester, is its parent).

A child asked with ``forks`` first forks a server of its own (``LOCAL``), before it starts
any thread: the processes it starts in turn (a judged run's loop instances) are forked from
that one, in the child's process group, and die with it, which dies with the child.
"""
from __future__ import annotations

import gc
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
from typing import Any

import psutil

from labkit import proc

REPLY_TIMEOUT_S = 60.0  # the server's start (its imports) on a loaded machine, then a fork
GONE_GRACE_S = 2.0  # a child found gone: how long its exit code may take to be written
KILLED = -signal.SIGKILL  # a child gone without an exit code: killed with its server


class Forked:
    """A child the server forked: the part of ``subprocess.Popen`` its requester uses."""

    def __init__(self, pid: int, status: Path):
        self.pid = pid
        self.returncode: int | None = None
        self._status = status
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

    def send_signal(self, signum: int) -> None:
        if self.leader is not None and self._running():
            self.leader.send_signal(signum)


class Client:
    """The requester's end: with ``module`` (the server's ``python -m``) and ``preload``,
    it starts the server on first use (again if it died); with ``sock``, it talks to a
    server already forked (``LOCAL``)."""

    def __init__(self, module: str = "", preload: tuple[str, ...] = (),
                 sock: socket.socket | None = None):
        self.module, self.preload = module, preload
        self._lock = threading.Lock()
        self._server: subprocess.Popen | None = None
        self._sock = sock
        self._reader = sock.makefile("rb") if sock is not None else None

    def fork(self, target: str, argument: Any, *, log: Path, status: Path,
             keep_fds: tuple[int, ...] = (), env: dict[str, str] | None = None,
             forks: bool = False, session: bool = True) -> Forked:
        """Fork a child running ``target(argument)`` (the argument JSON), its output
        appended to ``log``, its exit code written to ``status``; it holds ``keep_fds``
        (e.g. its slot's lock) as long as it lives. ``env``: its environment (this one's
        by default). ``forks``: it gets a server of its own (``LOCAL``). ``session``: it
        leads a session (and process group) of its own; else it stays in the server's."""
        request = {"target": target, "argument": argument, "log": str(log),
                   "status": str(status), "cwd": os.getcwd(),
                   "env": dict(os.environ) if env is None else env, "forks": forks,
                   "session": session}
        with self._lock:
            for attempt in (1, 2):  # a server that died (killed) is started again, once
                try:
                    if self.module and (self._server is None or self._server.poll() is not None):
                        self._start()
                    socket.send_fds(self._sock, [json.dumps(request).encode() + b"\n"],
                                    list(keep_fds))
                    return Forked(int(self._reply()), status)
                except (OSError, ValueError):
                    if not self.module or attempt == 2:
                        raise
                    self._close()

    def _start(self) -> None:
        self._close()
        ours, theirs = socket.socketpair()
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self._server = proc.spawn([sys.executable, "-m", self.module, str(theirs.fileno()),
                                   *self.preload], group=True, pass_fds=(theirs.fileno(),),
                                  stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        ours.settimeout(REPLY_TIMEOUT_S)
        self._sock, self._reader = ours, ours.makefile("rb")
        if self._reply() != "ready":
            raise OSError("the fork server did not start")

    def _reply(self) -> str:
        line = self._reader.readline()
        if not line:
            raise OSError("the fork server ended")
        return line.decode().strip()

    def _close(self) -> None:
        if self._server is not None:
            proc.kill([self._server])
        if self._sock is not None:
            self._sock.close()
        self._sock = self._server = None


LOCAL: Client | None = None  # in a child asked with ``forks``: its own server


# --------------------------------------------------------------------------- the server


def _serve(sock: socket.socket) -> dict | None:
    """Fork a child per request until the requester's end closes; in a forked child, its
    request (with ``fds``, what it was sent)."""
    children: dict[int, Path] = {}
    ended: dict[int, int] = {}

    def reap(*_: object) -> None:
        ended.update(proc.reap_forked())
        _write_status(children, ended)

    signal.signal(signal.SIGCHLD, reap)
    while True:
        line, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        if not line:
            return None  # the requester's end is closed
        while not line.endswith(b"\n"):  # a request longer than one read
            more = sock.recv(1 << 16)
            if not more:
                return None
            line += more
        request = json.loads(line)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # reaped once it is known
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the child reaps its own children
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            sock.close()
            return {**request, "fds": fds}  # it keeps them (its slot's lock) till it ends
        for fd in fds:
            os.close(fd)
        children[pid] = Path(request["status"])
        _write_status(children, ended)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        sock.sendall(f"{pid}\n".encode())


def _write_status(children: dict[int, Path], ended: dict[int, int]) -> None:
    for pid in [p for p in ended if p in children]:
        status, code = children.pop(pid), ended.pop(pid)
        partial = status.with_name(status.name + ".part")
        try:
            partial.write_text(str(code))
            partial.rename(status)  # read whole or not at all
        except OSError:
            pass  # its directory is gone: nobody waits for it


def _enter(request: dict) -> None:
    """In the forked child: a session of its own (if asked), the requester's environment
    and directory, its log."""
    if request["session"]:
        os.setsid()
    proc.die_with_parent()  # the server: which dies with its requester
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def _own_server(request: dict) -> dict | None:
    """Fork this child's own server (``LOCAL``), while it has no thread but this one. In
    the child: None. In that server: the request of each child it forks (None at its end)."""
    global LOCAL
    ours, theirs = socket.socketpair()
    parent = os.getpid()
    if os.fork() == 0:
        ours.close()
        for fd in request["fds"]:  # a slot's lock is the child's alone
            os.close(fd)
        proc.die_with_parent()
        if os.getppid() != parent:  # the child died before the death signal was armed
            os._exit(0)
        gc.freeze()
        return _serve(theirs)
    theirs.close()
    LOCAL = Client(sock=ours)
    return None


def _call(request: dict) -> int:
    try:
        named(request["target"])(request["argument"])
        return 0
    except KeyboardInterrupt:
        return 130
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1


def named(target: str) -> Any:
    """The object a ``module`` or ``module:function`` name names (imported)."""
    module, _, function = target.partition(":")
    found = importlib.import_module(module)
    return getattr(found, function) if function else found


def main(preload: list[str]) -> None:
    """The server's process: ``python -m <a module calling this> FD NAME...``."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only its children take an interrupt
    for name in preload:
        named(name)() if ":" in name else named(name)
    gc.freeze()  # a child's collections then skip what it shares: no copy of those pages
    sock.sendall(b"ready\n")
    request = _serve(sock)
    while request is not None:
        _enter(request)
        if request.get("forks"):
            served = _own_server(request)
            if served is not None or LOCAL is None:  # in that server: a child of its own, or its end
                request = served
                continue
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.exit(_call(request))  # the interpreter's exit flushes the log, runs atexit
