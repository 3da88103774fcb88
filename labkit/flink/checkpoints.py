"""A Flink job's retained checkpoints, read from its checkpoint directory.

Flink writes ``<dir>/<job id>/chk-<N>/`` when it triggers checkpoint N and the file
``_metadata`` in it when checkpoint N completes (every task has acknowledged it); only then
is the checkpoint restorable, and only then does the Kafka sink commit the transaction it
pre-committed for N. A restarted job gets a new job id (a new folder) and goes on numbering
from the checkpoint it restored. With ``RETAIN_ON_CANCELLATION`` the last completed
checkpoint stays when the job ends, a SIGKILL included.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

METADATA = "_metadata"


@dataclass(frozen=True)
class Checkpoint:
    id: int
    path: Path  # <dir>/<job id>/chk-<N>: what execution.state-recovery.path takes
    job_id: str
    completed: bool  # its _metadata is written
    completed_at: float | None  # when (the file's mtime), None while pending


def _id(folder: Path) -> int | None:
    try:
        return int(folder.name.removeprefix("chk-"))
    except ValueError:
        return None


def listed(root: Path) -> list[Checkpoint]:
    """Every checkpoint folder under ``root``, completed or pending, in id order."""
    found = []
    for folder in root.glob("*/chk-*"):
        n = _id(folder)
        if n is None:
            continue
        try:
            done_at = (folder / METADATA).stat().st_mtime
        except FileNotFoundError:  # pending, or deleted (subsumed) between glob and stat
            done_at = None
        found.append(Checkpoint(n, folder, folder.parent.name, done_at is not None, done_at))
    return sorted(found, key=lambda c: (c.id, c.completed_at or 0.0))


def completed(root: Path) -> list[Checkpoint]:
    return [c for c in listed(root) if c.completed]


def latest(root: Path) -> Checkpoint | None:
    """The checkpoint a supervisor restores from: the last one completed (by id, then time:
    a restored job numbers on from its checkpoint, so ids grow across restarts)."""
    done = completed(root)
    return done[-1] if done else None


def is_completed(folder: Path) -> bool:
    return (folder / METADATA).exists()


def pending(root: Path, after: int = 0) -> list[Checkpoint]:
    """Checkpoints triggered and not (yet) completed, with an id above ``after``."""
    return [c for c in listed(root) if not c.completed and c.id > after]
