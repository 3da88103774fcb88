"""The capstone's judged runs side by side, each in a process of its own.

A verdict is a dozen runs of the learner's loop, each mostly waiting (for a group to form,
a session to end, a fault's moment): one after the other they take over two minutes, side
by side about the time of the longest. Threads cannot run them: CPython 3.11's ``compile()``
is not thread-safe, and every run parses the learner's cell (docs/measurements.md, stop 49).

So each run is a process of its own, forked by the kernel's judge server
(``labkit.exercises.judge_server``, which has the judge imported): given the cell's text, the
function's name and the judge's options, it defines the function as the notebook did
(``learner.from_text``), runs the judge on it and writes what the capstone reads of the run
(``Outcome``) to a file. Its progress lines go to a log, quoted if it fails. A run no longer
wanted is interrupted (SIGINT: the runner stops its instances and deletes its topics, as for
a learner's interrupt), then killed with its process group.

Every judged run is stored (``RunRecord.store``) in the lab's home, ``judged/<learner>/``
(the learner's namespace; ``lab`` on the local lab), the newest ``KEEP_JUDGED`` kept: an
instructor replays a learner's verdict with ``labkit check PATH``, without Kafka; the
outcome says where (``stored``).

Runs side by side share the machine: at most ``slots()`` of them run at once on it, whoever
starts them (a room's learners on one machine too: 70 runs at once on 2 cores made the
judge's own reads of the broker time out). A run waits for a slot, then starts.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labkit import forkserver, proc
from labkit.checking.record import RunRecord
from labkit.exercises import judge_server
from labkit.kafka import names
from labkit.paths import lab_home
from labkit.pipelines import learner

SLOTS_ENV = "LABKIT_JUDGED_RUNS_AT_ONCE"  # how many judged runs one machine runs at once
SLOTS_DIR = Path(tempfile.gettempdir()) / "labkit-judged-runs"  # one per machine, every user
INTERRUPTED_GRACE_S = 20.0  # an interrupted run's clean-up (instances stopped, topics deleted)
LOG_TAIL = 30  # lines of a failed run's log quoted in its error
JUDGED = "judged"  # under the lab's home: each judged run, stored for ``labkit check``
KEEP_JUDGED = 200  # the newest stored runs kept (a verdict stores a dozen)


@dataclass(frozen=True)
class Outcome:
    """What the capstone reads of a judged run: the audit's counts, the findings, the errors."""

    produced: int
    lost: int
    duplicated: int
    aborted_visible: int
    exactly_once: bool
    anomalies: list[str] = field(default_factory=list)
    findings: dict[str, list] = field(default_factory=dict)
    errors: list[dict] = field(default_factory=list)
    stored: str = ""  # the run as a file, for ``labkit check`` ("" if it could not be stored)

    @classmethod
    def of(cls, run: RunRecord, stored: str = "") -> "Outcome":
        r = run.report
        return cls(r.produced, r.lost, r.duplicated, r.aborted_visible, r.exactly_once,
                   list(r.anomalies), {k: list(v) for k, v in run.findings.items()},
                   list(run.errors), stored)


def keep_judged(run: RunRecord) -> str:
    """The judged run stored in ``<lab home>/judged/<learner>/`` (the oldest beyond
    ``KEEP_JUDGED`` removed): its path, or "" when it cannot be stored, which costs the
    verdict nothing."""
    folder = lab_home() / JUDGED / (names.namespace() or "lab")
    name = (f"{time.strftime('%Y%m%d-%H%M%S')}-{run.options.get('phase', 'run')}-"
            f"{os.getpid()}-{time.monotonic_ns() % 10**6:06d}.jsonl")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = run.store(folder / name)
        for old in sorted(folder.glob("*.jsonl"))[:-KEEP_JUDGED]:
            old.unlink(missing_ok=True)
    except (OSError, ValueError) as exc:  # a full disk, an option that is not plain data
        print(f"the judged run was not stored ({exc})", flush=True)
        return ""
    return str(path)


class JudgedRunError(RuntimeError):
    """A run that ended without an outcome: its message quotes the end of its log."""


class Apart:
    """One judged run (``registry.run("judge", **options)``) of ``service``, started now in a
    process of its own. ``outcome()`` waits for it; ``cancel()`` stops it and what it
    started."""

    def __init__(self, service: Callable, bootstrap: str | None, **options: Any):
        slots()  # a wrong LABKIT_JUDGED_RUNS_AT_ONCE is said before anything starts
        self.options = options
        self._dir = Path(tempfile.mkdtemp(prefix="labkit-judged-"))
        self._spec = {"code": learner.code_of(service), "function": service.__name__,
                      "filename": f"<judged {service.__name__}>", "bootstrap": bootstrap,
                      "options": options, "out": str(self._dir / "outcome.json")}
        self.process: forkserver.Forked | None = None
        _RUNNING.add(self)
        self._start()

    def _start(self) -> None:
        """Start the run if a slot is free (else it stays queued: ``done()`` tries again)."""
        slot = _take_slot()
        if slot is None:
            return
        # a process group of its own: a cancel reaches what it started; it dies with us. It
        # holds the slot's lock (inherited): the slot is free again when the run's process ends
        try:
            self.process = judge_server.fork("labkit.exercises.side_by_side:run_spec",
                                             self._spec, self._dir, slot)
        finally:
            os.close(slot)

    def done(self) -> bool:
        if self.process is None:
            self._start()
            return False
        return self.process.poll() is not None

    def outcome(self) -> Outcome:
        """Waits for the run; its outcome, or a JudgedRunError with the end of its log."""
        try:
            while not self.done():
                time.sleep(0.2)
        except BaseException:  # the learner interrupted the cell: nothing is left running
            self.cancel()
            raise
        _RUNNING.discard(self)
        out = self._dir / "outcome.json"
        try:
            if self.process.returncode == 0 and out.exists():
                return Outcome(**json.loads(out.read_text()))
            log = (self._dir / "run.log").read_text(errors="replace").splitlines()
            raise JudgedRunError(f"the judge's run ({self.options.get('phase')}) ended with "
                                 f"code {self.process.returncode}:\n" + "\n".join(log[-LOG_TAIL:]))
        finally:
            self._clean()

    def cancel(self, wait: bool = True) -> None:
        """Interrupt the run (its clean-up runs), then kill what is left of its process
        group. ``wait=False``: in the background."""
        _RUNNING.discard(self)
        if self.process is None:  # still queued: nothing started
            self._clean()
            return
        stopper = threading.Thread(target=self._stop, name="judged-run-stop", daemon=True)
        stopper.start()
        if wait:
            stopper.join()

    def _stop(self) -> None:
        if self.process.poll() is None:  # SIGINT: as a learner's interrupt; then SIGKILL to
            proc.shut_down(self.process.leader, signal.SIGINT, INTERRUPTED_GRACE_S)  # the rest
        self.process.wait()
        self._clean()

    def _clean(self) -> None:
        for child in self._dir.glob("*"):
            child.unlink(missing_ok=True)
        self._dir.rmdir() if self._dir.exists() else None


_RUNNING: set[Apart] = set()


def slots() -> int:
    """Judged runs one machine runs at once: twelve a core. A run mostly waits (a group to
    form, a session to end), so ten learners' verdicts on two cores were held up by fewer
    slots: with its instances forked too, a run's CPU is small enough that 24 beat 16
    (74-78 s a verdict against 76-93 s; docs/measurements.md, stops 58 and 59).
    ``LABKIT_JUDGED_RUNS_AT_ONCE`` sets it."""
    wanted = os.environ.get(SLOTS_ENV, "").strip()
    if wanted:
        if not wanted.isdigit() or int(wanted) < 1:
            raise ValueError(f"{SLOTS_ENV}={wanted!r}: a whole number of runs, 1 or more")
        return int(wanted)
    return 12 * (os.cpu_count() or 2)


def _take_slot() -> int | None:
    """A free slot's locked file descriptor, or None when every slot is taken. A lock lasts
    as long as a process holds the descriptor: a run that ends, killed or not, frees it."""
    if not SLOTS_DIR.exists():
        SLOTS_DIR.mkdir(exist_ok=True)
        os.chmod(SLOTS_DIR, 0o1777)  # shared by the room's users, as /tmp is
    for n in range(slots()):
        # read-only is enough to lock, and what another user may open
        fd = os.open(SLOTS_DIR / f"slot-{n}", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            os.close(fd)
    return None


@atexit.register
def _stop_all() -> None:
    """The kernel exits: no judged run outlives it."""
    for run in list(_RUNNING):
        run.cancel()


def outcomes(runs: list[Apart], on_done: Callable[[int], None] = lambda n: None
             ) -> list[Outcome]:
    """Every run's outcome, in their order; ``on_done(n)`` as each one ends (n of them done).
    If one fails or the wait is interrupted, the others are stopped."""
    try:
        pending = set(range(len(runs)))
        while pending:
            for i in [i for i in pending if runs[i].done()]:
                pending.discard(i)
                on_done(len(runs) - len(pending))
            time.sleep(0.2)
        return [run.outcome() for run in runs]
    except BaseException:
        for run in runs:
            run.cancel(wait=False)
        raise


def run_spec(spec: dict) -> None:
    """In the run's own process: the learner's function defined from its text, judged."""
    from labkit.experiments import registry  # the run alone runs the judge

    service = learner.from_text(spec["code"], spec["function"], spec["filename"])
    options = spec["options"]
    run = registry.run("judge", pipeline=service, cluster=spec["bootstrap"], **options)
    Path(spec["out"]).write_text(json.dumps(asdict(Outcome.of(run, keep_judged(run))),
                                            default=str))
