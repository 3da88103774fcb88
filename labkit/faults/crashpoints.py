"""Named crash points: SIGKILL a worker process exactly at a named place in its code.

Worker code marks places with ``crash_point("after-process-before-commit")``. The runner
arms at most one of them for a child process through the environment
(``LABKIT_CRASH_AT=name``, ``LABKIT_CRASH_HIT=n``); when that point is reached for the
n-th time the process sends itself SIGKILL. Nothing is flushed, closed or committed:
exactly what a power cut or an OOM-kill does to a real consumer.

Every point is declared in ``CRASH_POINTS`` with one line that says where it is.

A point can also be armed to *stall* instead (``arm(name, hit, stall=True)``): the process
sends itself SIGSTOP there and freezes, heartbeats and all, as a long GC pause or a stuck
VM does, until the supervisor sends SIGCONT. That is how a zombie is made.
"""
from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from labkit import proc, settings

ENV_POINT, ENV_HIT, ENV_STALL = settings.CRASH_AT, settings.CRASH_HIT, settings.CRASH_STALL
CRASH_EXIT_CODE = -signal.SIGKILL  # what Popen.returncode shows for a crashed worker


@dataclass(frozen=True)
class CrashPoint:
    name: str
    description: str


CRASH_POINTS: dict[str, CrashPoint] = {p.name: p for p in [
    CrashPoint("after-poll-before-process", "records fetched by poll(), none processed yet"),
    CrashPoint("after-process-before-commit", "records processed (output written), offsets not yet committed"),
    CrashPoint("after-commit-before-process", "offsets committed before the records were processed"),
    CrashPoint("mid-batch", "half of the polled batch processed, the rest not"),
    CrashPoint("after-produce-before-flush", "produce() called, records still in the client's buffer"),
    CrashPoint("in-transaction-before-commit", "records produced inside an open transaction, no offsets sent yet"),
    CrashPoint("after-send-offsets-before-commit", "send_offsets_to_transaction done, commit_transaction not called"),
    CrashPoint("after-commit", "right after commit_transaction (or the offset commit) returned"),
    CrashPoint("after-state-update-before-commit", "local state store updated, changelog/output/offsets not committed"),
    # A service that writes its database and Kafka, one after the other (the dual write).
    CrashPoint("after-db-commit-before-produce", "dual write: the database transaction committed, its events not yet sent to Kafka"),
    CrashPoint("after-produce-before-db-commit", "dual write: the events sent to Kafka (flushed), the database transaction not yet committed"),
    CrashPoint("after-payment-before-event", "outbox: the payment rows written, their events (outbox rows) not yet"),
    # Share groups (KIP-932), per record: the record is acquired (locked) for this consumer.
    CrashPoint("after-acquire-before-process", "share group: record acquired (locked), not processed yet"),
    CrashPoint("after-process-before-ack", "share group: record processed (output written), its acknowledgement not yet committed"),
    CrashPoint("after-ack", "share group: acknowledgement committed (at_most_once: before processing)"),
    CrashPoint("spark-mid-sink", "Spark sink wrote part of a micro-batch"),
    CrashPoint("spark-after-sink-before-commit", "Spark sink wrote the micro-batch, the commit log entry not yet written"),
    CrashPoint("spark-after-commit", "Spark wrote the micro-batch's commit log entry"),
    # Not a SIGKILL of the driver: one executor task fails and Spark retries it.
    CrashPoint("spark-task-first-attempt", "a Spark task writing to the Kafka sink fails on its first attempt, after half its partition was sent; Spark retries the task"),
]}


class UnknownCrashPoint(ValueError):
    def __init__(self, name: str):
        valid = ", ".join(CRASH_POINTS)
        super().__init__(f"unknown crash point {name!r}. Valid crash points: {valid} "
                         "(`labkit crash-points` describes each).")


def validate(name: str | None) -> str | None:
    if name is not None and name not in CRASH_POINTS:
        raise UnknownCrashPoint(name)
    return name


def named(crash_at: str | list | tuple | None) -> list[str]:
    """The crash points ``crash_at`` names: none, one, or several ("a,b" or a list)."""
    if not crash_at:
        return []
    found = crash_at.split(",") if isinstance(crash_at, str) else list(crash_at)
    return [p.strip() for p in found]


def per_instance(crash_at: str | list | tuple | None, instances: int) -> list[str]:
    """The crash points of a group's run: one, or one per instance ("a,b" or a list: instance
    0 at a, instance 1 at b); a ValueError for an unknown one or more than one per instance."""
    armed = named(crash_at)
    for name in armed:
        validate(name)
    if len(armed) > instances:
        raise ValueError(f"{len(armed)} crash points for {instances} instance(s): one point "
                         "per instance at most")
    return armed


def arm(name: str | None, hit: int = 1, stall: bool = False) -> dict[str, str]:
    """Environment variables that arm ``name`` (on its ``hit``-th visit) in a child process:
    SIGKILL there, or with ``stall`` SIGSTOP (frozen until SIGCONT)."""
    validate(name)
    if hit < 1:
        raise ValueError(f"hit must be 1 or more, not {hit}")
    if not name:
        return {}
    return {ENV_POINT: name, ENV_HIT: str(hit), **({ENV_STALL: "1"} if stall else {})}


ENV_VARS = (ENV_POINT, ENV_HIT, ENV_STALL)


_visits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Mark a place in worker code; SIGKILL this process here if the point is armed."""
    if name not in CRASH_POINTS:
        raise UnknownCrashPoint(name)  # a typo in worker code must not silently never fire
    armed = settings.current()
    if armed.crash_at != name:
        return
    _visits[name] = _visits.get(name, 0) + 1
    if armed.crash_stall and _visits[name] == armed.crash_hit:
        proc.signal_self(signal.SIGSTOP)  # returns once the supervisor sends SIGCONT
    elif not armed.crash_stall and _visits[name] >= armed.crash_hit:
        proc.signal_self(signal.SIGKILL)


def reached(name: str) -> bool:
    """Count a visit of ``name`` and say whether it is the armed hit, without acting on it:
    for a point whose failure happens elsewhere (a Spark task on an executor fails instead
    of this process dying)."""
    if name not in CRASH_POINTS:
        raise UnknownCrashPoint(name)
    armed = settings.current()
    if armed.crash_at != name:
        return False
    _visits[name] = _visits.get(name, 0) + 1
    return _visits[name] == armed.crash_hit


def halves(items: list) -> tuple[list, list]:
    """Split a batch for a mid-batch crash point: the first half is done, then crash."""
    mid = len(items) // 2
    return items[:mid], items[mid:]


# What a worker child runs after its function returns (labkit.faults.runner): a crash point
# kills before any of it, as a crash is meant to. None outside a worker child (a notebook
# kernel goes on after a pipeline returns; holding its producers would leak them).
_AT_NORMAL_END: list[Callable[[], None]] | None = None


def at_normal_end(work: Callable[[], None]) -> None:
    """Run ``work`` when this worker process ends normally (never when it crashes)."""
    if _AT_NORMAL_END is not None:
        _AT_NORMAL_END.append(work)


def run_as_worker(worker: Callable[[], None]) -> None:
    """The runner's child: ``worker()``, then what it asked to run at its normal end."""
    global _AT_NORMAL_END
    _AT_NORMAL_END = []
    worker()
    while _AT_NORMAL_END:
        _AT_NORMAL_END.pop()()
