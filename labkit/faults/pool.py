"""The instances of one application as real child processes, supervised as systemd or
Kubernetes would: each one that dies is started again with the same settings, until every
instance has finished its input.

    pool = WorkerPool(ctp.run, [kwargs_a, kwargs_b], label="ctp", history_file=...)
    pool.arm(0, "mid-batch", hit=2)          # instance 0's first start dies there
    result = pool.run()                       # blocks; RunResult: attempts, exit codes, ...

The nemesis acts on a running pool from its own thread: ``kill`` (SIGKILL, restarted),
``freeze``/``thaw`` (SIGSTOP/SIGCONT: a long GC pause, a zombie), ``add`` (a member joins
the group), ``leave`` (SIGTERM, not restarted: a member leaves), ``replace`` (a successor
with the same settings, e.g. the same transactional.id, fences it; the old one is not
restarted once it ends). ``on_event(kind, fields)`` hears each start and exit, and each
event the workers write to the run's history (``labkit.checking.history``), so a fault can
fire on the workers' own progress.

A worker that exits with an error (not a kill) raises WorkerFailed with its log's tail, or,
with ``restart_failed``, is started again like a killed one (a judge's supervisor: what it
raised is kept in ``RunResult.failures``).

``command=`` runs an app instead of a Python function: each instance is the command in a
process group of its own (a kill reaches whatever it started: a shell's java, its
workers), each instance's settings are its environment (a setting None: left out of it),
and its logs (one per start) stay in ``logs_dir``. The ``LABKIT {json}`` lines an instance
prints are its events (``app_events``; told to ``on_event`` too, as the history's are).
``on_tick(pool)`` runs on every turn of the supervision loop (a judge watching the app's
progress as Kafka shows it; ``finish()`` ends the run).

``run()`` blocks until the instances are done (``labkit.faults.background`` runs it in a
thread of its own while an experiment's script drives the app).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from labkit import proc
from labkit.checking import history
from labkit.faults import crashpoints
from labkit.faults.children import Children, EventLines, HistoryTail, logs_dir, tail_of
from labkit.progress import beat, check, status, step, stopped

# What the supervisors write to the run's history themselves: not a worker's progress.
OWN_EVENTS = frozenset({"started", "exited", "killed", "stopped", "stalled", "progress",
                        "broker-killed", "broker-restarted", *history.RUNNER_KINDS})
# An instance's settings that say who it is to Kafka, kept with each start in the history:
# a checker ties a transaction or a member to the process that held it from the history
# alone.
IDENTITY = ("transactional_id", "instance_id")
LEAVE_GRACE_S = 10.0  # a leaving member's SIGTERM, then SIGKILL (a batch to finish, a close)
STOP_GRACE_S = 5.0  # the run's end: SIGTERM, then SIGKILL


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
    crashed_at: list[str] = field(default_factory=list)  # each armed point that fired
    exit_codes: list[int] = field(default_factory=list)  # -9 is SIGKILL
    durations_s: list[float] = field(default_factory=list)  # wall time of each attempt
    total_s: float = 0.0
    kills: int = 0  # SIGKILLs sent from outside (random kills, the nemesis)
    # exits with an error that were restarted (restart_failed): instance, attempt, code, tail
    failures: list[dict] = field(default_factory=list)

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


def payload(kwargs: dict) -> bytes:
    try:
        return json.dumps(kwargs).encode()
    except TypeError as exc:
        raise ValueError(f"worker arguments must be JSON-able plain data: {exc}") from None


@dataclass
class _Instance:
    kwargs: dict
    attempts: int = 0
    armed: dict[str, str] = field(default_factory=dict)  # crash env for its next start
    armed_point: str | None = None
    finished: bool = False
    gone: bool = False  # left or replaced: never started again
    started_at: float | None = None
    events: dict[int, list[dict]] = field(default_factory=dict)  # attempt -> its app events
    lines: EventLines | None = None  # the current attempt's log, read for its events


class WorkerPool:
    """Instances of ``worker`` (a module-level function, run as ``worker(**kwargs)``)."""

    def __init__(self, worker: Callable | str | None, instances: list[dict], *,
                 command: list[str] | None = None, logs_dir: Path | None = None,
                 label: str | None = None, history_file: str | None = None,
                 max_attempts: int = 4, timeout_s: float = 300.0,
                 restart_failed: bool | Callable[[int, int, str], None] = False,
                 on_event: Callable[[str, dict], None] | None = None,
                 on_crash: Callable[[], None] | None = None,
                 on_tick: Callable[["WorkerPool"], None] | None = None,
                 restart_exited: Callable[[int], bool] | None = None):
        if (worker is None) == (command is None):
            raise ValueError("give a worker function or a command, not both or neither")
        self.command = list(command) if command is not None else None
        self.target = target_name(worker) if worker is not None else " ".join(self.command)
        for kwargs in instances:
            payload(kwargs)  # refused before anything starts
        self.logs_dir = logs_dir
        self.on_tick = on_tick
        # asked when an instance exits 0: start it again? (a supervisor's restart policy
        # "always", for a loop that stops at the end of what it saw while more is to come)
        self.restart_exited = restart_exited
        self.label = label or self.target
        self.history_file = history_file
        self.max_attempts, self.timeout_s = max_attempts, timeout_s
        self.restart_failed = restart_failed
        self.on_event, self.on_crash = on_event, on_crash
        self.instances = [_Instance(dict(k)) for k in instances]
        # settings every instance gets unless its own say otherwise (known only once the
        # run has started: e.g. the bootstrap of a fault proxy in between)
        self.defaults: dict = {}
        self.result = RunResult(target=self.target, crash_at=None, hit=1)
        self._lock = threading.RLock()
        self._children: Children | None = None
        self._progress: Callable[[str], None] = lambda line: None
        self._over = False  # finish() was asked: nothing starts (again)
        # events of what happened under the lock, told once it is released: a fault told of
        # one may act on the pool, and the nemesis's thread may hold its own lock and wait
        # for this one (a pool that told it under the lock would wait for it: a deadlock)
        self._untold: list[tuple[str, dict]] = []

    # ------------------------------------------------------------------ the nemesis's side

    def arm(self, instance: int, point: str, hit: int = 1, stall: bool = False) -> None:
        """Instance ``instance``'s next start dies (or, ``stall``, freezes) at ``point``'s
        ``hit``-th visit."""
        self._check_instance(instance)
        with self._lock:
            self.instances[instance].armed = crashpoints.arm(point, hit, stall)
            if not stall:  # a stall is not a crash: the process comes back by itself
                self.instances[instance].armed_point = point
                self.result.crash_at, self.result.hit = point, hit

    def running(self, instance: int) -> bool:
        with self._lock:
            return self._children is not None and self._children.alive(instance)

    def started_at(self, instance: int) -> float | None:
        """When the instance's current attempt started (monotonic), None if not running."""
        with self._lock:
            return self.instances[instance].started_at if self.running(instance) else None

    def kill(self, instance: int) -> bool:
        """SIGKILL the instance (it is started again); was it running?"""
        with self._lock:
            if self._children is None or not self._children.kill(instance):
                return False
            self.result.kills += 1
            if self.history_file:
                history.append(self.history_file, "killed", instance=str(instance),
                               attempt=self.instances[instance].attempts)
            return True

    def instance_on_port(self, port: int) -> int | None:
        """The running instance one of whose processes (it, or what it started) has a TCP
        connection from local ``port``; None if none has."""
        with self._lock:
            pids = self._children.pids() if self._children is not None else {}
        for i, pid in pids.items():
            try:
                family = [psutil.Process(pid)]
                family += family[0].children(recursive=True)
            except psutil.Error:
                continue
            for process in family:
                try:
                    if any(c.laddr and c.laddr.port == port
                           for c in process.net_connections(kind="tcp")):
                        return i
                except psutil.Error:
                    continue
        return None

    def stacks(self, instance: int) -> str:
        """The running instance's threads' stacks (``proc.stacks``), "" if it is not running."""
        with self._lock:
            pid = self._children.pids().get(instance) if self._children is not None else None
        return proc.stacks(pid) if pid is not None else ""

    def freeze(self, instance: int) -> bool:
        with self._lock:
            return self._children is not None and self._children.signal(instance, signal.SIGSTOP)

    def thaw(self, instance: int) -> bool:
        with self._lock:
            return self._children is not None and self._children.signal(instance, signal.SIGCONT)

    def frozen(self, instance: int) -> bool:
        with self._lock:
            return self._children is not None and self._children.stopped(instance)

    def add(self, kwargs: dict) -> int:
        """A new instance joins (started now); its number."""
        payload(kwargs)
        with self._lock:
            self.instances.append(_Instance(dict(kwargs)))
            i = len(self.instances) - 1
            if self._children is not None:
                self._start(i)
        self._tell_untold()
        return i

    def leave(self, instance: int) -> None:
        """The instance leaves for good: SIGTERM (its loop may close its consumer and leave
        the group), SIGKILL after STOP_GRACE_S; not started again."""
        with self._lock:
            self.instances[instance].gone = True
            children = self._children
        if children is not None:
            children.terminate(instance, LEAVE_GRACE_S)

    def replace(self, instance: int, **changes: object) -> int:
        """A successor with the instance's settings (``changes`` on top) starts now; the old
        instance is not started again once it ends (fenced, it should stop by itself)."""
        with self._lock:
            self.instances[instance].gone = True
            kwargs = {**self.instances[instance].kwargs, **changes}
        return self.add(kwargs)

    def finish(self, grace_s: float = STOP_GRACE_S) -> None:
        """The run is over: every instance stopped (SIGTERM, SIGKILL after ``grace_s``),
        none started again."""
        with self._lock:
            self._over = True
            for inst in self.instances:
                inst.gone = True
            children = self._children
        if children is None:
            return
        if self.history_file:
            for i, inst in enumerate(self.instances):
                if children.alive(i):
                    history.append(self.history_file, "stopped", instance=str(i),
                                   attempt=inst.attempts)
        children.stop_all(grace_s)

    def app_events(self, instance: int, attempt: int | None = None) -> list[dict]:
        """The ``LABKIT {json}`` lines the instance's current start (or start ``attempt``,
        counted from 1) has printed so far."""
        with self._lock:
            inst = self.instances[instance]
            return list(inst.events.get(attempt or inst.attempts, []))

    def log_tail(self, instance: int) -> str:
        """The last lines of the instance's current (or last) attempt's log."""
        with self._lock:
            return self._children.tail(instance) if self._children is not None else ""

    # ------------------------------------------------------------------ supervision

    def run(self) -> RunResult:
        """Start every instance; restart each that dies until all have finished (or left)."""
        started = time.monotonic()
        with status(f"Running {self.label}") as progress, \
                logs_dir(self.logs_dir) as logs, \
                Children(Path(logs), group=self.command is not None) as children:
            self._progress = progress
            with self._lock:
                self._children = children
                for i in range(len(self.instances)):
                    if not self._over:  # finished before it began (a script that failed)
                        self._start(i)
            tail = HistoryTail(self.history_file)
            try:
                while children.running:
                    self._tell_untold()
                    if time.monotonic() - started > self.timeout_s:
                        raise WorkerFailed(f"{self.label}: did not finish within "
                                           f"{self.timeout_s:.0f} s\n{children.tails()}")
                    events = tail.new()
                    if any(e["kind"] not in OWN_EVENTS for e in events):
                        beat("the workers' next batch")  # progress, for the watchdog
                    for event in events:
                        self._tell(event.pop("kind"), event)
                    for i in range(len(self.instances)):
                        self._read_events(i)
                    with self._lock:  # kill, freeze, finish come from other threads
                        ended = children.reap()
                    for i, code, seconds, log in ended:
                        self._ended(i, code, seconds, log)
                    if self.on_tick is not None and children.running:
                        self.on_tick(self)
                    time.sleep(0.05)
            finally:
                with self._lock:
                    self._children = None
        self.result.total_s = round(time.monotonic() - started, 3)
        return self.result

    def _start(self, i: int) -> None:
        check()  # a run its watchdog stopped restarts nothing
        inst = self.instances[i]
        inst.attempts += 1
        self.result.attempts += 1
        armed, inst.armed = inst.armed, {}
        inst.started_at = time.monotonic()
        settings = {**self.defaults, **inst.kwargs}
        env = _child_env(armed, i, self.history_file, inst.attempts)
        log = f"instance-{i}-attempt-{inst.attempts}.log"
        inst.events[inst.attempts], inst.lines = [], EventLines(self._children.logs_dir / log)
        if self.command is not None:  # an app: its settings are its environment
            env.update({k: str(v) for k, v in settings.items() if v is not None})
            for unset in (k for k, v in settings.items() if v is None):
                env.pop(unset, None)
            pid = self._children.start(i, self.command, None, log, env)
        else:
            pid = self._children.start_worker(i, self.target, settings, log, env)
        if stopped():  # while it started: the stop's sweep may have listed processes before it
            self._children.kill(i)
            check()
        if self.history_file:
            history.append(self.history_file, "started", instance=str(i),
                           attempt=inst.attempts, pid=pid,
                           **{k: settings[k] for k in IDENTITY if settings.get(k) is not None})
        step(f"{self.label}: instance {i} started (attempt {inst.attempts})",
             f"instance {i} to process its input")
        self._untold.append(("instance-started", {"instance": i, "attempt": inst.attempts}))

    def _read_events(self, i: int) -> None:
        """The app events instance ``i``'s current start printed since the last look."""
        inst = self.instances[i]
        new = inst.lines.new() if inst.lines is not None else []
        for event in new:
            with self._lock:
                inst.events.setdefault(inst.attempts, []).append(event)
            fields = {k: v for k, v in event.items() if k != "event"}
            self._tell(str(event.get("event", "app-event")),
                       {**fields, "instance": i, "attempt": inst.attempts})

    def _ended(self, i: int, code: int, seconds: float, log: Path) -> None:
        inst = self.instances[i]
        self._read_events(i)  # its last lines, before a new start reads another log
        step(f"{self.label}: instance {i} exited with code {code}", "the other instances")
        self.result.exit_codes.append(code)
        self.result.durations_s.append(seconds)
        if self.history_file:
            history.append(self.history_file, "exited", instance=str(i), attempt=inst.attempts,
                           code=code)
        crashed_here = code == crashpoints.CRASH_EXIT_CODE and inst.armed_point is not None
        if crashed_here:
            self.result.crashed = True
            self.result.crashed_at.append(inst.armed_point)
        self._tell("instance-exited", {"instance": i, "attempt": inst.attempts, "code": code})
        with self._lock:
            if code == 0 and not inst.gone and self.restart_exited is not None \
                    and self.restart_exited(i):
                self._progress(f"{self.label}: instance {i} exited, its input not consumed: "
                               f"started again (attempt {inst.attempts + 1})")
                self._start(i)
                return
            if code == 0 or inst.gone:
                inst.finished = code == 0
                return
            if code != crashpoints.CRASH_EXIT_CODE:
                if not self.restart_failed:
                    raise WorkerFailed(f"{self.label}: instance {i} attempt {inst.attempts} "
                                       f"exited with code {code}\n{tail_of(log)}")
                self.result.failures.append({"instance": i, "attempt": inst.attempts,
                                             "code": code, "log": tail_of(log)})
                if callable(self.restart_failed):  # may raise: a judge's own limit
                    self.restart_failed(i, code, tail_of(log))
            if crashed_here:
                where, inst.armed_point = f"killed at {inst.armed_point}", None
                if self.on_crash is not None:  # while it is down, before the restart
                    self.on_crash()
            elif code == crashpoints.CRASH_EXIT_CODE:
                where = "killed at a random time"
            else:
                where = f"failed with exit code {code}"
            if inst.attempts >= self.max_attempts:
                raise WorkerFailed(f"{self.label}: instance {i} ended {inst.attempts} times, "
                                   f"giving up\n{tail_of(log)}")
            who = f" instance {i}" if len(self.instances) > 1 else ""
            self._progress(f"{self.label}:{who} {where}, restarting (attempt {inst.attempts + 1})")
            self._start(i)

    def _tell(self, kind: str, fields: dict) -> None:
        if self.on_event is not None:
            self.on_event(kind, fields)

    def _tell_untold(self) -> None:
        """The events of what happened under the lock (starts), told outside it."""
        with self._lock:
            untold, self._untold = self._untold, []
        for kind, fields in untold:
            self._tell(kind, fields)

    def _check_instance(self, instance: int) -> None:
        if not 0 <= instance < len(self.instances):
            raise ValueError(f"instance must be between 0 and {len(self.instances) - 1}, "
                             f"not {instance}")


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
