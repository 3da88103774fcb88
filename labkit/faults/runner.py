"""Run a worker as real child processes, crash it at a named point, restart it like a supervisor.

    result = run_worker(ctp.run, dict(bootstrap=..., ...), crash_at="after-commit", hit=2)
    result.crashed, result.attempts, result.exit_codes      # True, 2, [-9, 0]

The worker is a module-level function called with JSON-able keyword arguments in a fresh
``python -m labkit.faults.runner`` process, or, in a judged run, forked from a server that
has this module imported (``run_forked``; ``labkit.faults.pool.WorkerPool`` supervises
them). These functions are the pool under a few of the nemesis's process faults
(``labkit.faults.process_faults``): a crash at a named point, random kills, a frozen
instance and its successor (a zombie). An experiment composes the same faults itself
(``labkit.experiments``).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from labkit.checking import history
from labkit.faults import crashpoints
from labkit.faults.nemesis import Event, Fault, Nemesis, on
from labkit.faults.pool import RunResult, WorkerFailed, WorkerPool
from labkit.faults.process_faults import CrashAt, Frozen, Join, RandomKills, StallAt, Thaw
from labkit.progress import step

__all__ = ["RunResult", "WorkerFailed", "run_worker", "run_workers", "run_zombie", "supervised",
           "PoolRun"]


@dataclass
class PoolRun:
    """The run a process fault acts on when a pool is supervised on its own (no experiment
    around it): its ``workers`` and where the faults say what they did."""

    workers: WorkerPool
    bootstrap: str = ""
    cluster: Any = None
    facts: dict = field(default_factory=dict)
    fired_faults: list[str] = field(default_factory=list)

    @property
    def clients(self) -> WorkerPool:
        return self.workers

    def step(self, what: str, waiting_for: str | None = "its next step",
             detail: str = "") -> None:
        step(what, waiting_for)

    def fired(self, fault: Fault, what: str, **fields: Any) -> None:
        self.fired_faults.append(what)
        step(what)


def supervised(pool: WorkerPool, *faults: Fault) -> RunResult:
    """``pool.run()`` under ``faults``: set up first, polled and fired while it runs, torn
    down after it (a frozen instance thawed, whatever happened)."""
    run, nemesis = PoolRun(pool), Nemesis(*faults)
    pool.on_event = lambda kind, fields: nemesis.notify(run, Event(kind, fields))
    with nemesis.active(run):
        return pool.run()


def run_worker(worker: Callable | str, kwargs: dict, crash_at: str | None = None, hit: int = 1,
               max_attempts: int = 4, timeout_s: float = 300.0, label: str | None = None,
               history_file: str | None = None,
               on_crash: Callable[[], None] | None = None) -> RunResult:
    """Run ``worker(**kwargs)`` in a child process until it finishes, crashing it once.
    ``on_crash`` runs after the armed crash killed it and before the restart (the world
    changing while the worker is down, e.g. a lookup table edited).

    Raises UnknownCrashPoint for a bad ``crash_at`` (listing the valid ones) and WorkerFailed
    if an attempt exits with an error, times out, or the worker never finishes."""
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
    they ended; ``attempts`` counts them all."""
    crashpoints.arm(crash_at, hit)  # validates the name and hit first
    if not 0 <= crash_instance < len(instances):
        raise ValueError(f"crash_instance must be between 0 and {len(instances) - 1}, "
                         f"not {crash_instance}")
    pool = WorkerPool(worker, instances, label=label, history_file=history_file,
                      max_attempts=max(max_attempts, kills + 2), timeout_s=timeout_s,
                      on_crash=on_crash)
    faults: list[Fault] = [CrashAt(crash_at, hit, crash_instance)] if crash_at else []
    if kills:
        faults.append(RandomKills(kills, kill_after_s, crash_instance, seed))
    result = supervised(pool, *faults)
    result.crash_at, result.hit = crash_at, hit
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
    pool = WorkerPool(worker, [zombie], label=label, history_file=history_file,
                      timeout_s=timeout_s)
    stall = StallAt(stall_at, hit, instance=0)
    join = Join(Frozen(0), successor, name="a successor takes over")
    wake = Thaw(0, on("instance-exited", instance=1, code=0))
    result = supervised(pool, stall, join, wake)
    if join.joined is None:
        raise WorkerFailed(f"{pool.label}: instance 0 never reached its stall point "
                           f"{stall_at!r} (it exited with code {result.exit_codes[0]})")
    stalled_s = round((wake.thawed_at or time.monotonic()) - (stall.frozen_at or 0.0), 3)
    # any other exit than 0 (or a kill, restarted) has raised WorkerFailed by now
    return ZombieResult(0, 0, stalled_s)


def _main(target: str) -> None:
    """Child side (``python -m``): import the worker, read its kwargs from stdin, run it."""
    _end_with_supervisor()
    _run(target, json.loads(sys.stdin.read()))


def run_forked(argument: dict) -> None:
    """Child side, forked from a server that has this module imported
    (``labkit.forkserver``): ``{"target": ..., "kwargs": ...}``."""
    _end_with_supervisor()
    _run(argument["target"], argument["kwargs"])


def _run(target: str, kwargs: dict) -> None:
    module, _, func = target.partition(":")
    worker = getattr(importlib.import_module(module), func)
    # then e.g. fire-and-forget writes reach the log (labkit.pipelines.common.DeliveryTracker.drain)
    try:
        crashpoints.run_as_worker(lambda: worker(**kwargs))
    except Exception as exc:  # what it raised, with its class, for a judge of its reactions
        history.record("raised", **error_class(exc))
        raise


def _end_with_supervisor(every_s: float = 0.5) -> None:
    """A worker never outlives the process that supervises it: once re-parented (that
    process died), it ends itself. Workers started from a supervisor's thread get no death
    signal (``labkit.proc.die_with_owner``), so a supervisor SIGKILLed without its clean-up
    (a judged run whose notebook kernel ended) left them running: three in a fresh clone's
    suite, after notebook 10."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)  # nobody is left to read it: no clean-up, as a SIGKILL would

    threading.Thread(target=watch, name="labkit-supervisor-watch", daemon=True).start()


def error_class(exc: BaseException) -> dict:
    """What a worker raised: its type and text, and for a Kafka error (a KafkaException's
    KafkaError) its code and class: fatal, abortable (txn_requires_abort) or retriable."""
    found: dict = {"error": type(exc).__name__, "text": str(exc)[:400]}
    error = exc.args[0] if exc.args else None
    if all(hasattr(error, m) for m in ("name", "fatal", "retriable", "txn_requires_abort")):
        found.update(code=error.name(), fatal=error.fatal(), retriable=error.retriable(),
                     abortable=error.txn_requires_abort(), text=error.str()[:400])
    return found


if __name__ == "__main__":
    _main(sys.argv[1])
