"""Where in a checkpoint the lab SIGKILLs a Flink job, aimed from outside and checked.

- ``mid-checkpoint``: checkpoint N is triggered and not complete. With EXACTLY_ONCE, also
  after the sink has pre-committed N's transaction: the broker shows ``<prefix>-0-N``
  Ongoing (flushed, never to get another record) and already knows ``<prefix>-0-<N+1>``,
  the transaction the sink opened for the next checkpoint right after the pre-commit.
  A restart restores checkpoint N-1: N's transaction must be aborted and its input read again.
- ``before-commit``: checkpoint N has completed (its ``_metadata`` is written) and, with
  EXACTLY_ONCE, its transaction is still Ongoing at the broker: the sink has not committed
  it yet. A restart restores N and must commit that transaction itself, unless the broker
  has aborted it meanwhile (the job stayed down past ``transaction.timeout.ms``).
- ``random``: a moment drawn at random within one checkpoint interval of the last
  completed checkpoint.

Both windows last milliseconds, so the lab does not hope to land in them: it polls the
checkpoint folder, SIGSTOPs the whole job the moment the folder changes, asks the broker
(ListTransactions, DescribeTransactions) while the job stands still, and SIGKILLs it only if
the broker shows the window; otherwise the job goes on (SIGCONT) and the next checkpoint is
tried. A stopped process does nothing, so what the broker said is what the kill hit.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.flink import checkpoints
from labkit.flink.process import JobProcess
from labkit.kafka.inspect.client import Inspector

KILL_POINTS = ("mid-checkpoint", "before-commit", "random")
POLL_S = 0.0005  # the checkpoint folder is a local directory: cheap to look at this often


class MissedWindow(RuntimeError):
    """No checkpoint gave the window before the deadline (the job stopped checkpointing?)."""


@dataclass(frozen=True)
class Kill:
    point: str
    checkpoint: int | None  # the checkpoint the kill was aimed at
    transaction: str | None  # the sink's transaction for it (EXACTLY_ONCE)
    state: str | None  # that transaction's state at the coordinator, the job frozen
    # ... and once the job was dead: still Ongoing shows no commit was on its way
    state_after_kill: str | None
    since_checkpoint_ms: float | None  # since the last completed checkpoint's _metadata
    tries: int  # checkpoints looked at (the last one hit)
    at: float  # time.time() of the SIGKILL

    def describe(self) -> str:
        where = {"mid-checkpoint": f"checkpoint {self.checkpoint} triggered, not complete",
                 "before-commit": f"checkpoint {self.checkpoint} complete",
                 "random": "a random moment"}[self.point]
        txn = (f"; {self.transaction} {self.state} at the broker" if self.transaction else "")
        if self.transaction and self.state_after_kill != self.state:
            txn += f" ({self.state_after_kill} once the job was dead)"
        since = ("" if self.since_checkpoint_ms is None
                 else f", {self.since_checkpoint_ms:.0f} ms after the last completed checkpoint")
        return f"SIGKILL at {self.point}: {where}{txn}{since}"


def transaction_of(prefix: str, checkpoint: int, subtask: int = 0) -> str:
    """The transactional id Flink's sink (its default naming) uses for one checkpoint."""
    return f"{prefix}-{subtask}-{checkpoint}"


class _Aim:
    def __init__(self, job: JobProcess, root: Path, bootstrap: str, prefix: str,
                 exactly_once: bool, deadline: float):
        self.job, self.root, self.prefix = job, root, prefix
        self.exactly_once, self.deadline = exactly_once, deadline
        self.inspector = Inspector(bootstrap)
        self.tries = 0

    def check_alive(self) -> None:
        if not self.job.alive:
            raise MissedWindow(f"the job exited (code {self.job.popen.returncode}) before the "
                               f"kill; its last lines:\n{self.job.log_tail()}")
        if time.monotonic() > self.deadline:
            raise MissedWindow("no checkpoint gave the window in time")

    def state(self, transactional_id: str) -> str | None:
        found = self.inspector.describe_transactions([transactional_id])
        return found[0].state if found else None

    def next_pending(self, after: int) -> checkpoints.Checkpoint:
        while True:
            self.check_alive()
            found = checkpoints.pending(self.root, after)
            if found:
                self.tries += 1
                return found[0]
            time.sleep(POLL_S)

    def kill(self, point: str, cp: int | None, txn: str | None, state: str | None) -> Kill:
        since = None
        last = checkpoints.latest(self.root)
        self.job.sigkill()
        at = time.time()
        if last is not None and last.completed_at is not None:
            since = (at - last.completed_at) * 1000
        after = self.state(txn) if txn else None
        return Kill(point, cp, txn, state, after, since, self.tries, at)

    def mid_checkpoint(self) -> Kill:
        after = _last_id(self.root)
        while True:
            cp = self.next_pending(after)
            while not checkpoints.is_completed(cp.path):
                self.check_alive()
                self.job.freeze()
                try:
                    if checkpoints.is_completed(cp.path):
                        break  # completed before the freeze: the window closed, next one
                    if not self.exactly_once:  # nothing to ask the broker: triggered is enough
                        return self.kill("mid-checkpoint", cp.id, None, None)
                    txn = transaction_of(self.prefix, cp.id)
                    if transaction_of(self.prefix, cp.id + 1) in self.inspector.transactional_ids():
                        state = self.state(txn)
                        if state == "Ongoing":
                            return self.kill("mid-checkpoint", cp.id, txn, state)
                        break  # nothing written in N (no transaction to pre-commit): next one
                finally:
                    if self.job.alive:
                        self.job.thaw()
                time.sleep(POLL_S)
            after = cp.id

    def before_commit(self) -> Kill:
        after = _last_id(self.root)
        while True:
            cp = self.next_pending(after)
            while not checkpoints.is_completed(cp.path):
                self.check_alive()
                time.sleep(POLL_S)
            self.job.freeze()
            try:
                if not self.exactly_once:
                    return self.kill("before-commit", cp.id, None, None)
                txn = transaction_of(self.prefix, cp.id)
                state = self.state(txn)
                if state == "Ongoing":  # complete, not committed: the window
                    return self.kill("before-commit", cp.id, txn, state)
            finally:
                if self.job.alive:
                    self.job.thaw()
            after = cp.id

    def at_random(self, interval_ms: int, rng: random.Random) -> Kill:
        while checkpoints.latest(self.root) is None:
            self.check_alive()
            time.sleep(0.01)
        last = checkpoints.latest(self.root)
        assert last is not None and last.completed_at is not None
        moment = last.completed_at + rng.uniform(0, interval_ms / 1000)
        while time.time() < moment:
            self.check_alive()
            time.sleep(min(POLL_S * 10, max(0.0, moment - time.time())))
        pending = checkpoints.pending(self.root, last.id)
        return self.kill("random", pending[0].id if pending else None, None, None)


def _last_id(root: Path) -> int:
    last = checkpoints.latest(root)
    return last.id if last else 0


def kill_at(job: JobProcess, point: str, *, checkpoint_root: Path, bootstrap: str,
            prefix: str, exactly_once: bool, interval_ms: int, rng: random.Random,
            timeout_s: float) -> Kill:
    """SIGKILL ``job`` (its whole process group) at ``point`` of a checkpoint taken after
    this call; what the kill hit, as the broker and the checkpoint folder showed it."""
    if point not in KILL_POINTS:
        raise ValueError(f"unknown kill point {point!r}: choose one of {', '.join(KILL_POINTS)}")
    aim = _Aim(job, checkpoint_root, bootstrap, prefix, exactly_once,
               time.monotonic() + timeout_s)
    try:
        if point == "mid-checkpoint":
            return aim.mid_checkpoint()
        if point == "before-commit":
            return aim.before_commit()
        return aim.at_random(interval_ms, rng)
    finally:
        aim.inspector.close()
