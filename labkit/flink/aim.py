"""Where in a checkpoint the lab SIGKILLs a Flink job, aimed from outside and checked.

- ``mid-checkpoint``: checkpoint N is triggered and not complete. With EXACTLY_ONCE, also
  after the sink has pre-committed N's transaction: the broker shows ``<prefix>-0-N``
  Ongoing (flushed, never to get another record) and already knows ``<prefix>-0-<N+1>``,
  the transaction the sink opened for the next checkpoint right after the pre-commit.
  A restart restores checkpoint N-1: N's transaction must be aborted and its input read again.
  With AT_LEAST_ONCE, also after the sink has written records since N-1 completed (the
  output's high watermark has grown): what the restart will write again.
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

``AimedKill`` is that kill as a fault of an experiment's nemesis: fired by an event the
clients report (``on("checkpointed", start=1)``), it aims at the run's job
(``labkit.flink.clients.FlinkJob.kill_at``) and keeps it down ``down_s`` seconds.
"""
from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from pathlib import Path

from labkit import progress
from labkit.faults.nemesis import Fault, Run, Trigger
from labkit.flink import checkpoints
from labkit.flink.process import JobProcess
from labkit.kafka.inspect.client import Inspector

KILL_POINTS = ("mid-checkpoint", "before-commit", "random")
POLL_S = 0.0005  # the checkpoint folder is a local directory: cheap to look at this often
# A commit the frozen job sent just before it froze reaches the coordinator within this,
# most of the time; the kill is made only if the transaction is still Ongoing then (and a run
# whose kill came after the commit anyway is made again: ``missed``).
SETTLE_S = 0.2


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
    producer_id: int | None  # the transaction's producer id: its records in the log carry it
    # ... and its epoch: a restored job reuses an id (same producer id, a new epoch), so the
    # id and the producer id name every use of it; this names the one the kill hit
    producer_epoch: int | None
    timeout_ms: int | None  # the transaction's timeout as the coordinator knows it
    since_checkpoint_ms: float | None  # since the last completed checkpoint's _metadata
    tries: int  # checkpoints looked at (the last one hit)
    at: float  # time.time() of the SIGKILL
    # the aimed checkpoint complete (its _metadata written) once the job was dead
    completed_after_kill: bool | None = None

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
    def __init__(self, job: JobProcess, root: Path, bootstrap: str, prefix: str, output: str,
                 exactly_once: bool, deadline: float):
        self.job, self.root, self.prefix, self.output = job, root, prefix, output
        self.exactly_once, self.deadline = exactly_once, deadline
        self.inspector = Inspector(bootstrap)
        self.tries = 0
        self.producer_ids: dict[str, int] = {}
        self.epochs: dict[str, int] = {}
        self.timeouts: dict[str, int] = {}

    def check_alive(self) -> None:
        if not self.job.alive:
            raise MissedWindow(f"the job exited (code {self.job.popen.returncode}) before the "
                               f"kill; its last lines:\n{self.job.log_tail()}")
        if time.monotonic() > self.deadline:
            raise MissedWindow("no checkpoint gave the window in time")

    def state(self, transactional_id: str) -> str | None:
        found = self.inspector.describe_transactions([transactional_id])
        if found:
            self.producer_ids[transactional_id] = found[0].producer_id
            self.epochs[transactional_id] = found[0].producer_epoch
            self.timeouts[transactional_id] = found[0].timeout_ms
        return found[0].state if found else None

    def next_pending(self, after: int) -> checkpoints.Checkpoint:
        """Wait for a checkpoint above ``after`` to be triggered. Its folder is looked for by
        name (a stat: the loop runs every half millisecond beside a busy JVM), the whole
        folder listed every 0.1 s in case Flink skipped an id."""
        last = checkpoints.latest(self.root)
        job_dir = last.path.parent if last else None
        for polls in itertools.count():
            self.check_alive()
            if job_dir is not None and (job_dir / f"chk-{after + 1}").is_dir():
                found = [checkpoints.Checkpoint(after + 1, job_dir / f"chk-{after + 1}",
                                                job_dir.name, False, None)]
            else:
                found = checkpoints.pending(self.root, after) if polls % 200 == 0 else []
            if found:
                self.tries += 1
                return found[0]
            time.sleep(POLL_S)
        raise AssertionError("unreachable")

    def settled(self, cp: checkpoints.Checkpoint) -> bool:
        """Completed, or given up (Flink triggered the next one)."""
        return (checkpoints.is_completed(cp.path)
                or (cp.path.parent / f"chk-{cp.id + 1}").is_dir())

    def kill(self, point: str, cp: int | None, txn: str | None, state: str | None) -> Kill:
        since = None
        last = checkpoints.latest(self.root)
        epoch = self.epochs.get(txn or "")  # as the job stood frozen: the use the kill hits
        self.job.sigkill()
        at = time.time()
        if last is not None and last.completed_at is not None:
            since = (at - last.completed_at) * 1000
        after = self.state(txn) if txn else None
        done = None if cp is None else checkpoints.is_completed(
            (last.path.parent if last else self.root) / f"chk-{cp}")
        return Kill(point, cp, txn, state, after, self.producer_ids.get(txn or ""),
                    epoch, self.timeouts.get(txn or ""), since,
                    self.tries, at, done)

    def known_up_to(self) -> int:
        """The highest checkpoint id among the sink's transactional ids the broker knows."""
        mine = f"{self.prefix}-0-"
        return max((int(t[len(mine):]) for t in self.inspector.transactional_ids()
                    if t.startswith(mine) and t[len(mine):].isdigit()), default=0)

    def written(self) -> int:
        """The output's high watermark (every record written, committed or not)."""
        return sum(o.high_watermark for o in self.inspector.offsets(self.output).values())

    def precommitted(self, checkpoint: int, written_before: int
                     ) -> tuple[str, str | None, str | None]:
        """With the job frozen during ``checkpoint``: "kill" (the sink has pre-committed it;
        AT_LEAST_ONCE: has written since the last checkpoint), "wait", or "next" (nothing was
        written for it: the next checkpoint)."""
        if not self.exactly_once:
            return ("kill" if self.written() > written_before else "wait"), None, None
        if transaction_of(self.prefix, checkpoint + 1) not in self.inspector.transactional_ids():
            return "wait", None, None
        txn = transaction_of(self.prefix, checkpoint)
        state = self.state(txn)
        return ("kill" if state == "Ongoing" else "next"), txn, state

    def mid_checkpoint(self) -> Kill:
        after = _last_id(self.root)
        # A restored job numbers its checkpoints again from the one it restored, so the ids a
        # killed start opened (and the restore's probing for lingering transactions) are
        # known already: only a checkpoint whose next id is new tells a pre-commit by its id.
        stale = self.known_up_to() if self.exactly_once else 0
        # AT_LEAST_ONCE: what the output held when the last checkpoint had completed; a
        # record written after it came after that checkpoint's barrier
        written_before = 0 if self.exactly_once else self.written()
        while True:
            cp = self.next_pending(after)
            if cp.id + 1 <= stale:
                after = cp.id
                continue
            while not self.settled(cp):
                self.check_alive()
                with self.job.frozen():
                    if self.settled(cp):
                        break  # completed before the freeze: the window closed, next one
                    verdict, txn, state = self.precommitted(cp.id, written_before)
                    if verdict == "kill":
                        return self.kill("mid-checkpoint", cp.id, txn, state)
                    if verdict == "next":
                        break
                time.sleep(POLL_S)
            after = cp.id
            written_before = 0 if self.exactly_once else self.written()

    def before_commit(self) -> Kill:
        after = _last_id(self.root)
        while True:
            cp = self.next_pending(after)
            while not self.settled(cp):
                self.check_alive()
                time.sleep(POLL_S)
            if not checkpoints.is_completed(cp.path):
                after = cp.id  # given up: the next one
                continue
            with self.job.frozen():
                if not self.exactly_once:
                    return self.kill("before-commit", cp.id, None, None)
                txn = transaction_of(self.prefix, cp.id)
                state = self.state(txn)
                if state == "Ongoing":  # complete, not committed: the window, unless the
                    # sink sent its commit just before the freeze and the coordinator has
                    # yet to read it: asked again a moment later, the answer is the commit's
                    time.sleep(SETTLE_S)
                    state = self.state(txn)
                if state == "Ongoing":
                    return self.kill("before-commit", cp.id, txn, state)
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
            prefix: str, output_topic: str, exactly_once: bool, interval_ms: int,
            rng: random.Random, timeout_s: float) -> Kill:
    """SIGKILL ``job`` (its whole process group) at ``point`` of a checkpoint taken after
    this call; what the kill hit, as the broker and the checkpoint folder showed it.
    ``exactly_once``: the job was asked for EXACTLY_ONCE; a learner's job may set its sink's
    guarantee itself, so the broker decides: a sink that has completed a checkpoint and
    registered no transactional id (``<prefix>-0-N``) writes without transactions, and the
    kill is aimed as for AT_LEAST_ONCE."""
    if point not in KILL_POINTS:
        raise ValueError(f"unknown kill point {point!r}: choose one of {', '.join(KILL_POINTS)}")
    aim = _Aim(job, checkpoint_root, bootstrap, prefix, output_topic, exactly_once,
               time.monotonic() + timeout_s)
    try:
        if exactly_once and checkpoints.latest(checkpoint_root) is not None:
            aim.exactly_once = aim.known_up_to() > 0
        if point == "mid-checkpoint":
            return aim.mid_checkpoint()
        if point == "before-commit":
            return aim.before_commit()
        return aim.at_random(interval_ms, rng)
    finally:
        aim.inspector.close()


def missed(kill: Kill) -> str | None:
    """Why ``kill`` missed its window, or None: a transaction that was Ongoing while the job
    stood frozen and is something else once the job is dead had its commit on the way (a
    starved machine's coordinator read it late), so the kill hit after the commit; a
    mid-checkpoint kill whose checkpoint is complete once the job is dead came after it."""
    if kill.transaction and kill.state_after_kill != kill.state:
        return (f"the SIGKILL at {kill.point} came after the sink had sent its commit of "
                f"{kill.transaction} (the broker: {kill.state_after_kill} once the job was "
                "dead)")
    if kill.point == "mid-checkpoint" and kill.completed_after_kill:
        return (f"checkpoint {kill.checkpoint} completed before the SIGKILL at mid-checkpoint "
                "took the job")
    return None


class AimedKill(Fault):
    """SIGKILL the run's Flink job (its Python and its JVM) at ``point`` of one of its next
    checkpoints when ``trigger`` fires, then keep it down ``down_s`` seconds (the clients
    restart it once this returns; ``transaction.timeout.ms`` is the broker's patience with
    what the job left open meanwhile). ``kill``: what it hit, None until it has."""

    def __init__(self, point: str, trigger: Trigger, down_s: float = 0.0, seed: int = 0):
        if point not in KILL_POINTS:
            raise ValueError(f"unknown kill point {point!r}: choose from {', '.join(KILL_POINTS)}")
        if down_s < 0:
            raise ValueError(f"a job stays down 0 seconds or more, not {down_s}")
        self.point, self.trigger, self.down_s = point, trigger, down_s
        self.rng = random.Random(seed)
        self.kill: Kill | None = None
        self.name = f"SIGKILL at {point}"

    def invoke(self, run: Run) -> None:
        job = run.workers  # labkit.flink.clients.FlinkJob
        self.kill = job.kill_at(self.point, self.rng)
        # what it hit, as the audit names the fault (a stored run's too: its history's)
        run.fired(self, f"{job.job.name}: {self.kill.describe()}", kill=self.kill.describe())
        if self.down_s:
            run.step(f"the job stays down {self.down_s:g} s", "the job's restart")
            until = time.monotonic() + self.down_s
            while (left := until - time.monotonic()) > 0:
                time.sleep(min(left, 1.0))
                progress.beat("the job's restart")  # down on purpose: not a stall
