"""Process hygiene in one place: children that die with their owner, liveness that a
recycled pid cannot fool, stopping a process with everything it started, finding processes.

    child = proc.spawn(cmd, group=True)          # dies with this process (PR_SET_PDEATHSIG)
    pid, started = child.pid, proc.create_time(child.pid)   # store both, never the pid alone
    proc.alive(pid, started)                     # False once it exited, or the pid was reused
    proc.stop([child], timeout_s=10)             # SIGTERM it and its descendants, SIGKILL the rest

Every module that starts or stops a long-lived process (the brokers, the worker pool's
workers, the Spark workers and Connect server, the torture harness's apps) goes through here;
no other module reads /proc or calls os.kill. One-shot commands (mvn, the storage format
tool) stay ``subprocess.run``.

A pid alone is not an identity: after a process exits the kernel hands its pid to the next
process, so a state file's pid may name anybody. A psutil.Process remembers its start time
and refuses to signal a different process with the same pid; for a pid read from a file, its
start time (``create_time``) is stored beside it and compared (``process``).
"""
from __future__ import annotations

import ctypes
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil

# Two processes with the same pid started this close together would need the pid space to
# wrap within the interval; a stored start time further off than this is another process.
SAME_START_S = 0.05
KILL_WAIT_S = 10.0




# --------------------------------------------------------------------------- starting


def die_with_parent() -> None:
    """This process gets SIGKILL when its parent dies (run in a child after fork: between
    fork and exec, or in a forked server's child)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the owner's cleanup, atexit and the stale-lab check still stop it


def die_with_owner() -> Callable[[], None] | None:
    """A Popen ``preexec_fn`` that makes the child die with this process (SIGKILL).

    The kernel sends PR_SET_PDEATHSIG when the *thread* that forked the child ends, so it
    is only armed from the main thread: a child started in a background thread (a
    dashboard's experiment, a spare Spark worker) would otherwise be killed as soon as that
    thread finished. ``spawn`` forks such children from a thread that lives as long as
    this process instead (``_Forker``), so they die with it too."""
    return die_with_parent if threading.current_thread() is threading.main_thread() else None


class _Forker:
    """One thread, alive as long as this process, that forks the owned children other
    threads start: their death signal then comes when this process ends, however it ends
    (a notebook's kernel SIGKILLed while a nemesis thread had restarted a broker left that
    broker running before)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def fork(self, start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        with self._lock:  # a forked copy of this process has the object but not the thread
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="labkit-forker",
                                                daemon=True)
                self._thread.start()
        done, outcome = threading.Event(), {}
        self._calls.put((start, outcome, done))
        done.wait()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["child"]

    def _serve(self) -> None:
        while True:
            start, outcome, done = self._calls.get()
            try:
                outcome["child"] = start()
            except BaseException as exc:  # handed back to the thread that asked
                outcome["error"] = exc
            finally:
                done.set()


_FORKER = _Forker()


def spawn(cmd: Sequence[str], *, owned: bool = True, group: bool = False,
          as_user: tuple[int, int] | None = None, **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **popen_kwargs)`` for a long-lived child.

    ``owned``: it gets SIGKILL when this process dies, also when started from a thread
    that ends before it (``_Forker``); False for a child meant to outlive us (a detached
    lab). ``group``: it leads a session (and process group) of its own, so Ctrl-C in a
    terminal or notebook does not reach it and ``stop(..., group=True)`` reaches whatever
    it starts. ``as_user``: (uid, gid) it runs as, no other groups (root starting a server that refuses root); it still dies with us: the
    death signal is armed after the user is changed, which would otherwise clear it."""
    if as_user is not None:
        popen_kwargs.update(user=as_user[0], group=as_user[1], extra_groups=[])

    def start() -> subprocess.Popen:
        return subprocess.Popen(list(cmd), start_new_session=group,
                                preexec_fn=die_with_parent if owned else None, **popen_kwargs)
    if owned and threading.current_thread() is not threading.main_thread():
        return _FORKER.fork(start)
    return start()


def reap_forked() -> list[tuple[int, int]]:
    """(pid, exit code as Popen gives it: -N for signal N) of each child of this process
    that has ended, reaped now: for a server whose children were forked, not Popen's."""
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, os.waitstatus_to_exitcode(status)))


# --------------------------------------------------------------------------- identity


def create_time(pid: int | None) -> float | None:
    """When process ``pid`` started (seconds since the epoch), None if there is none: what
    to store beside a pid so a recycled pid is not taken for the same process later."""
    p = process(pid)
    return None if p is None else p.create_time()


def process(pid: int | None, started: float | None = None) -> psutil.Process | None:
    """The running process ``pid`` (not a zombie), or None. With ``started`` (its
    ``create_time`` when it was ours), a process that got the same pid later is None too."""
    if not pid:
        return None
    try:
        p = psutil.Process(pid)
        if started is not None and abs(p.create_time() - started) > SAME_START_S:
            return None  # the pid was recycled: this is somebody else
        if p.status() == psutil.STATUS_ZOMBIE:
            return None  # exited, not yet reaped: it does nothing any more
        return p
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def alive(pid: int | None, started: float | None = None) -> bool:
    """Is ``pid`` running (and, with ``started``, still the process that started then)?"""
    return process(pid, started) is not None


def pid_alive(pid: int | None) -> bool:
    """Is ``pid`` running (not a zombie)? Prefer ``alive(pid, started)`` for a stored pid."""
    return alive(pid)


def command_line(p: psutil.Process) -> str | None:
    """Its command line as one string; None if it cannot be read (gone, another user's)."""
    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def ours(pid: int | None, started: float | None, marker: str) -> psutil.Process | None:
    """The process ``pid`` (started at ``started`` if given) if its command line carries
    ``marker`` (e.g. ``kafka.Kafka``): only ever signal a process that is what we think."""
    p = process(pid, started)
    if p is None:
        return None
    cmd = command_line(p)
    # Unreadable (another user's): it is alive, and we could not signal it anyway.
    return p if cmd is None or marker in cmd else None


def find(marker: str) -> list[psutil.Process]:
    """Every running process whose command line contains ``marker`` (e.g. a worker's tag
    that its JVM carries as ``-Dlabkit.worker=TAG``), except this one."""
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        cmd = command_line(p)
        if cmd is not None and marker in cmd and process(p.pid, p.create_time()) is not None:
            found.append(p)
    return found


def descendants(root: subprocess.Popen | psutil.Process | int) -> list[psutil.Process]:
    """Every process ``root`` started, and theirs (psutil's children(recursive=True))."""
    p = root if isinstance(root, psutil.Process) else process(root if isinstance(root, int) else root.pid)
    if p is None:
        return []
    try:
        return p.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


def is_stopped(pid: int) -> bool:
    """Is ``pid`` stopped (SIGSTOP: a frozen consumer)?"""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def group_members(pgid: int) -> list[int]:
    """The pids of process group ``pgid`` now (a Flink job's Python and its JVM)."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                found.append(p.pid)
        except OSError:  # gone meanwhile
            continue
    return found


def all_threads_stopped(pids: Iterable[int]) -> bool:
    """Is every thread of ``pids`` stopped (a SIGSTOP reaches a JVM's threads one by one,
    over milliseconds), or gone?"""
    for pid in pids:
        try:
            for thread in psutil.Process(pid).threads():
                if psutil.Process(thread.id).status() not in (
                        psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP,
                        psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    return False
        except (psutil.NoSuchProcess, psutil.ZombieProcess):  # gone meanwhile
            continue
    return True


def rss_mb(pid: int) -> float:
    """Resident memory now, in MiB (NaN when it has gone)."""
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return float("nan")


def peak_rss_mb(pid: int) -> float:
    """The most resident memory it ever had (Linux's VmHWM), in MiB; NaN when unknown.
    psutil has no high-water mark, so this is the one place that reads /proc."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def stacks(pid: int, timeout_s: float = 15.0) -> str:
    """Where a live process and what it started are, thread by thread: a Python process's
    stacks by py-spy (which reads them from outside, with native frames: a call blocked in
    librdkafka shows), a JVM's by its own ``jcmd <pid> Thread.print``. For a process the lab
    is about to kill because it made no progress: what it was waiting for. Empty when none
    of the family is Python or Java, or the tool is missing."""
    try:
        family = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return ""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = []
    for p in family:
        try:
            name = os.path.basename(p.exe() or p.name())
        except psutil.Error:
            continue
        if name.startswith("python"):
            cmd = [py_spy, "dump", "--native", "--pid", str(p.pid)]
        elif name == "java":
            cmd = [str(Path(p.exe()).with_name("jcmd")), str(p.pid), "Thread.print"]
        else:
            continue
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            out.append(f"$ {' '.join(cmd)}\n{done.stdout or done.stderr}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            out.append(f"$ {' '.join(cmd)}\n(no stacks: {exc})")
    return "\n".join(out)


# --------------------------------------------------------------------------- stopping


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to every process in group ``pgid`` (a child started with group=True
    leads one whose id is its pid); False if none is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def signal_self(sig: int) -> None:
    """This process sends itself ``sig`` (a crash point's SIGKILL, a freeze's SIGSTOP)."""
    os.kill(os.getpid(), sig)


class _Targets:
    """What one stop/kill acts on: our own children as Popen objects (so their exit code
    is collected by Popen and stays readable), other processes as psutil.Process objects
    (signals refuse a recycled pid), and with ``tree`` every descendant, listed before the
    first signal (once a parent dies its children are re-parented and can no longer be
    found from it)."""

    def __init__(self, targets: Iterable, tree: bool, group: bool):
        self.group = group
        self.leaders: list[int] = []
        self.popens: list[subprocess.Popen] = []
        self.others: dict[int, psutil.Process] = {}
        for t in targets:
            if t is None:
                continue
            if isinstance(t, subprocess.Popen):
                if t.returncode is not None and not group:
                    continue  # already reaped: its pid may be somebody else's now
                self.popens.append(t)
                self.leaders.append(t.pid)
            else:
                self.others[t.pid] = t
                self.leaders.append(t.pid)
        if tree:  # (never from a reaped Popen's pid: it may be somebody else's by now)
            for root in [*(p for p in self.popens if p.returncode is None), *list(self.others.values())]:
                for child in descendants(root):
                    self.others.setdefault(child.pid, child)
        mine = {p.pid for p in self.popens}
        self.others = {pid: p for pid, p in self.others.items() if pid not in mine}

    def send(self, sig: int) -> None:
        for p in self.popens:
            if p.poll() is None:  # Popen never signals a pid it has reaped
                p.send_signal(sig)
        for p in list(self.others.values()):
            try:
                p.send_signal(sig)  # psutil: NoSuchProcess rather than hit a recycled pid
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                pass
        if self.group:  # also members we never saw (re-parented, double-forked)
            for pgid in self.leaders:
                signal_group(pgid, sig)

    @staticmethod
    def _gone(p: psutil.Process) -> bool:
        try:
            if not p.is_running():  # exited, or its pid now belongs to another process
                return True
            p.wait(timeout=0)  # reaps it if it is our child that exited
            return True
        except psutil.TimeoutExpired:
            try:  # a zombie has exited; its parent (or init) reaps it
                return p.status() == psutil.STATUS_ZOMBIE
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                return True
        except (psutil.NoSuchProcess, psutil.ZombieProcess, ChildProcessError):
            return True

    def wait(self, timeout_s: float) -> bool:
        """Wait until every target has exited (and our children are reaped); all gone?"""
        deadline = time.monotonic() + timeout_s
        while True:
            self.popens = [p for p in self.popens if p.poll() is None]
            self.others = {pid: p for pid, p in self.others.items() if not self._gone(p)}
            if not self.popens and not self.others:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def pids(self) -> list[int]:
        return [p.pid for p in self.popens] + list(self.others)


def stop(targets: Iterable, timeout_s: float = 10.0, *, tree: bool = True, group: bool = False,
         kill_wait_s: float = KILL_WAIT_S) -> list[int]:
    """SIGTERM every target at once (a chance to shut down cleanly), SIGKILL whatever has not
    exited ``timeout_s`` later; returns the pids that needed the SIGKILL.

    ``targets``: Popen objects of our own children or psutil.Process objects (from
    ``process``/``ours``/``find``; a bare pid is not accepted: it may be recycled).
    ``tree``: their descendants too (a worker's JVM). ``group``: each target leads a process
    group (spawned with group=True): the whole group is signalled, and gets the SIGKILL
    whatever happened, so no member outlives its leader."""
    what = _Targets(targets, tree, group)
    what.send(signal.SIGTERM)
    killed: list[int] = []
    if not what.wait(timeout_s):
        killed = what.pids()
        what.send(signal.SIGKILL)
    elif group:
        for pgid in what.leaders:
            signal_group(pgid, signal.SIGKILL)
    what.wait(kill_wait_s)
    return killed


def kill(targets: Iterable, *, tree: bool = True, group: bool = False,
         wait_s: float = KILL_WAIT_S) -> bool:
    """SIGKILL every target (and with ``tree`` its descendants, with ``group`` its group) at
    once, then wait until they are gone and our children reaped; did they all go?"""
    what = _Targets(targets, tree, group)
    what.send(signal.SIGKILL)
    return what.wait(wait_s)


def shut_down(leader: subprocess.Popen | psutil.Process, sig: int, timeout_s: float = 10.0,
              *, kill_wait_s: float = KILL_WAIT_S) -> bool:
    """A server's own clean shutdown: ``sig`` to ``leader`` alone (a database server tells its
    children itself, in its order; signalled directly they could misread it), then SIGKILL
    to whatever of it is left: itself after ``timeout_s``, and its descendants and process
    group (listed before the first signal: PostgreSQL's children lead sessions of their
    own, and once it is gone they are re-parented). Did it exit in time by itself?"""
    rest = _Targets([leader], tree=True, group=True)
    first = _Targets([leader], tree=False, group=False)
    first.send(sig)
    clean = first.wait(timeout_s)
    rest.send(signal.SIGKILL)
    rest.wait(kill_wait_s)
    return clean
