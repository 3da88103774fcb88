"""10 · capstone: make the payments service exactly-once. The learner writes the loop; the
judge (``labkit.experiments.judge``) runs it as production does and audits what it wrote.

Fast feedback first. ``run_capstone`` runs the learner's function as two instances of one
group over six partitions, each instance SIGKILLed at a named crash point its code passes
(two points a run), then once with a lost produce acknowledgement and a refused record, and
once SIGKILLed as it sends its first commit (of its transaction, or of its offsets: where a
loop's guarantee is decided, whatever crash points it kept), and audits each run as
accounting reads the ledger (``accounting_reads``): a table, a row per
run (``split=True``: a run that fails is run again point by point, so each row names one
point); a status line counts its seconds. Once every row is exact, ``check_capstone`` puts
the loop under production's faults, seeded: three instances, the input arriving while they
work, SIGKILLs at random moments, a member joining and one leaving, a zombie, an abortable
error on a Produce and on the offsets, a successor fencing an instance; under both group
protocols when the function takes ``group_protocol``.
A schedule that breaks the loop is run again one kind of fault at a time until the kind
that breaks it is found. The verdict names it and what it found, with a hint that points
at the cause, never at the code that fixes it (``capstone_hints``).

Every run is a process of its own, and they run side by side
(``labkit.exercises.side_by_side``): the points together, and production's schedules
started with them, so a right loop's whole verdict takes about its longest run. A row that
is not exact stops the schedules: the learner has the table's answer first.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import json
import threading
import time
from collections.abc import Callable

import pandas as pd

from labkit.checking.record import RunRecord
from labkit.exercises import Verdict, check, exercise
from labkit.exercises.capstone_hints import (FINDING_HINTS, KIND_HINTS, findings_of,
                                             finding_text, point_hints)
from labkit.exercises.side_by_side import Apart, Outcome, keep_judged, outcomes
from labkit.experiments import registry
from labkit.experiments.judge import PHASES
from labkit.faults.crashpoints import CRASH_POINTS
from labkit.faults.production import COMMIT_KILL
from labkit.pipelines import learner
from labkit.progress import status

PAYMENTS = 300
# Two instances read three partitions each: a batch often spans partitions, so offsets or a
# rewind that hold for one partition only show.
PARTITIONS = 6
ACCOUNTING_READS = ("read_committed", "read_uncommitted")
WIRE = "drop-ack:produce:1"  # the broker writes a produce request; its ack is lost
# then a refused record (an abortable error)
WIRE_RUN = WIRE + "+error:produce:3:INVALID_RECORD"
# The run that crashes every loop where its guarantee is decided, whatever crash points it
# kept: an instance SIGKILLed as it sends its first commit, its output written, whether the
# commit is its transaction's (EndTxn: its records are in the log whatever it flushed,
# aborted, so the way accounting reads the ledger is judged) or its offsets' (OffsetCommit)
COMMITTING = ("as it commits",)  # not a crash point's name: the run's place in the list
# Points every version of the loop has (it polls, writes half a batch, finishes a batch):
# without them the audit could not crash it where duplicates and losses come from.
REQUIRED_POINTS = ("after-poll-before-process", "mid-batch", "after-commit")
KINDS = ("kills", "wire", "rebalance", "zombie", "offsets", "fenced")  # the order they are tried in


def service_code(service: Callable) -> str:
    """The text of the service's own definition: the last ``def`` of its name in its cell (a
    cell may define it twice, e.g. the team's version and a fix below it; the last one runs)."""
    found = learner.definition(service)
    if found is None:
        raise ValueError(f"no 'def {service.__name__}' found in the cell that defines it")
    return ast.get_source_segment(learner.code_of(service), found) or ""


def crash_points_in(service: Callable) -> list[str]:
    """The named crash points the service's code passes, in the order they appear in it."""
    return learner.crash_points_in(service, CRASH_POINTS)


def validate(service: Callable, accounting_reads: str) -> None:
    """A ValueError that says what to change, before anything runs."""
    if not callable(service):
        raise ValueError("the service must be your function itself (def ledger_service...), "
                         f"not {type(service).__name__}")
    if accounting_reads not in ACCOUNTING_READS:
        raise ValueError(f"accounting_reads = {accounting_reads!r}: choose one of "
                         f"{ACCOUNTING_READS}")
    missing = [p for p in REQUIRED_POINTS if p not in crash_points_in(service)]
    if missing:
        raise ValueError(f"{service.__name__} no longer calls crash_point() at {missing}: keep "
                         "those lines where they were, so the lab can kill your loop there")


def experiments(service: Callable) -> list[tuple[str, ...]]:
    """The point runs: the service's crash points two at a time (one per instance), then
    the wire run (``()``: a lost ack, a refused record), then a crash as a commit is sent
    (``COMMITTING``)."""
    found = crash_points_in(service)
    return [tuple(found[i:i + 2]) for i in range(0, len(found), 2)] + [(), COMMITTING]


def label(points: tuple[str, ...]) -> str:
    """What a point run does, in words: its crash points, the wire, or the commit."""
    if points == COMMITTING:
        return "crash as its commit is sent"
    return f"crash at {' and '.join(points)}" if points else "lost produce ack, refused record"


FINDINGS = ("lost", "charged_twice", "aborted_visible")


def found(results: pd.DataFrame) -> pd.DataFrame:
    """Which findings each run of ``results`` had, yes or no (the counts depend on where in
    a batch each kill landed; whether there were any does not)."""
    table = results.set_index("experiment")
    return pd.DataFrame({name.replace("_", " "): table[name].map(lambda n: "yes" if n else "")
                         for name in FINDINGS}).rename_axis("run")


def judge_options(accounting_reads: str, crash_at: str | tuple | None = None,
                  fault: str | None = None, payments: int = PAYMENTS, phase: str = "point",
                  **options) -> dict:
    """The judge's options for one run of the capstone (``registry.run("judge", ...)``)."""
    if crash_at == COMMITTING:
        crash_at, fault = None, COMMIT_KILL
    if phase == "point" and not crash_at and fault is None:
        fault = WIRE_RUN
    options.setdefault("partitions", PARTITIONS)
    return dict(phase=phase, crash_at=list(crash_at) if isinstance(crash_at, tuple) else
                crash_at or None, fault=fault if phase == "point" else None,
                records=payments, isolation=accounting_reads, **options)


def run_one(service: Callable, accounting_reads: str, crash_at: str | tuple | None = None,
            fault: str | None = None, bootstrap: str | None = None, payments: int = PAYMENTS,
            phase: str = "point", **options) -> RunRecord:
    """One judged run of the learner's service, here (see ``labkit.experiments.judge``)."""
    validate(service, accounting_reads)
    watch = options.pop("watch", None)
    return registry.run("judge", pipeline=service, cluster=bootstrap, watch=watch,
                        **judge_options(accounting_reads, crash_at, fault, payments, phase,
                                        **options))


def apart(service: Callable, accounting_reads: str, bootstrap: str | None = None,
          crash_at: str | tuple | None = None, **options) -> Apart:
    """One judged run of the learner's service, started in a process of its own."""
    return Apart(service, bootstrap, **judge_options(accounting_reads, crash_at, **options))


def _row(label: str, run: Outcome) -> dict:
    found = findings_of(run)
    return {"experiment": label, "payments": run.produced, "lost": run.lost,
            "charged_twice": run.duplicated, "aborted_visible": run.aborted_visible,
            "findings": ", ".join(found), "exactly_once": run.exactly_once and not found}


def run_capstone(service: Callable, accounting_reads: str, bootstrap: str | None = None,
                 payments: int = PAYMENTS, watch: Callable | None = None,
                 split: bool = False) -> pd.DataFrame:
    """The named points (two instances, six partitions; two points a run), the wire and the
    commit, side by side: one row a run. ``watch`` (a live view of the run's topics) follows
    the first run; ``split``: a run that is not exact is run again point by point, its rows
    naming one point each. Production's faults start at the same time, for the verdict
    (``check_capstone``) to take up; a row that is not exact stops them."""
    validate(service, accounting_reads)
    _stop_pending()  # an earlier attempt's: this code is judged now
    planned = experiments(service)
    production = [apart(service, accounting_reads, bootstrap, **schedule)
                  for schedule in _schedule_options(service)]
    try:
        with _Elapsed("The named points") as clock:
            outs = _side_by_side(service, accounting_reads, bootstrap, planned, clock,
                                 payments=payments, watch=watch)
            rows, stored = [], [o.stored for o in outs]
            for points, run in zip(planned, outs):
                if split and not _row("", run)["exactly_once"] and len(points) == 2:
                    alone = _side_by_side(service, accounting_reads, bootstrap,
                                          [(p,) for p in points], clock, payments=payments)
                    rows += [_row(label((p,)), o) for p, o in zip(points, alone)]
                    stored += [o.stored for o in alone]
                else:
                    rows.append(_row(label(points), run))
    except BaseException:
        for run in production:
            run.cancel(wait=False)
        raise
    results = pd.DataFrame(rows)
    results.attrs["digest"] = _digest(service, accounting_reads, results)
    results.attrs["bootstrap"] = bootstrap  # the verdict takes up its runs on that cluster
    results.attrs["stored"] = stored  # each run as a file: ``labkit check PATH`` replays it
    if results["exactly_once"].all():
        _PENDING[_key(service, accounting_reads, bootstrap)] = production
    else:
        for run in production:
            run.cancel(wait=False)
    return results


def _side_by_side(service: Callable, accounting_reads: str, bootstrap: str | None,
                  planned: list[tuple[str, ...]], clock: "_Elapsed", payments: int,
                  watch: Callable | None = None) -> list[Outcome]:
    """The point runs ``planned``, each in a process of its own (the first here when it is
    ``watch``ed: its live view is drawn by this process)."""
    clock.now(f"{len(planned)} runs side by side")
    here = planned[:1] if watch else []
    runs = [apart(service, accounting_reads, bootstrap, points, payments=payments)
            for points in planned[len(here):]]
    try:
        watched = []
        for points in here:
            record = run_one(service, accounting_reads, points, bootstrap=bootstrap,
                             payments=payments, watch=watch)
            watched.append(Outcome.of(record, keep_judged(record)))
    except BaseException:
        for run in runs:
            run.cancel(wait=False)
        raise
    return watched + outcomes(runs, on_done=lambda n: clock.now(
        f"{n + len(here)} of {len(planned)} runs done"))


# Production's faults started with the points, by the code and reads they judge: the
# verdict takes them up (one attempt at a time: a new attempt stops an earlier one's).
_PENDING: dict[str, list[Apart]] = {}


def _key(service: Callable, accounting_reads: str, bootstrap: str | None) -> str:
    blob = json.dumps([learner.code_of(service), service.__name__, accounting_reads,
                       bootstrap])
    return hashlib.sha256(blob.encode()).hexdigest()


def _stop_pending() -> None:
    while _PENDING:
        for run in _PENDING.popitem()[1]:
            run.cancel(wait=False)


class _Elapsed:
    """A status line that says what runs now and the seconds since it began, once a second
    (a verdict takes minutes: the learner sees it move)."""

    def __init__(self, title: str, started: float | None = None):
        self.title, self.what = title, ""
        self.started = time.monotonic() if started is None else started
        self._stop = threading.Event()

    def now(self, what: str) -> None:
        self.what = what
        self._say()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def _say(self) -> None:
        self.say(f"{self.title}: {self.what}, {self.seconds:.0f} s so far")

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._say()

    def __enter__(self) -> "_Elapsed":
        self._status = status(self.title)
        self.say = self._status.__enter__()
        self._ticker = threading.Thread(target=self._tick, name="capstone-clock", daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._ticker.join()
        self._status.__exit__(*exc)


def schedules(service: Callable) -> list[str]:
    """The group protocols the schedule runs under: both when the service takes
    ``group_protocol`` (KIP-848's consumer protocol moves partitions differently)."""
    takes = "group_protocol" in inspect.signature(service).parameters
    return ["classic", "consumer"] if takes else ["classic"]


SEED = 10  # production's schedule: the same faults in the same order for every learner


def _schedule_options(service: Callable) -> list[dict]:
    """Production's whole schedule, once per group protocol: three instances, the input
    arriving while they work."""
    return [dict(phase="schedule", instances=3, payments=600, seed=SEED, group_protocol=p)
            for p in schedules(service)]


def under_production(service: Callable, accounting_reads: str, bootstrap: str | None = None,
                     started: list[Apart] | None = None,
                     on_start: Callable[[str], None] = lambda what: None
                     ) -> list[tuple[str, Outcome]]:
    """The seeded schedule of production's faults under each group protocol, side by side
    (``started``: those runs, begun with the points); where it breaks the loop, each kind of
    fault alone, side by side, until the first kind (in ``KINDS``' order) that breaks it
    too: (what ran, its outcome), in order. ``on_start(what)`` is told what runs now."""
    protocols = schedules(service)
    runs = started or [apart(service, accounting_reads, bootstrap, **o)
                       for o in _schedule_options(service)]
    on_start(f"production's faults ({' and '.join(protocols)} protocol"
             f"{'s side by side' if len(protocols) > 1 else ''})")
    ran = [(f"production's faults ({p} protocol)", o)
           for p, o in zip(protocols, outcomes(runs))]
    broken = [p for p, (_, o) in zip(protocols, ran) if not _row("", o)["exactly_once"]]
    if not broken:
        return ran
    protocol = broken[0]
    ran = ran[:protocols.index(protocol) + 1]
    on_start(f"each kind of fault alone, side by side ({protocol} protocol)")
    alone = outcomes([apart(service, accounting_reads, bootstrap, phase=kind, seed=SEED,
                            group_protocol=protocol) for kind in KINDS])
    for kind, outcome in zip(KINDS, alone):
        ran.append((f"{PHASES[kind]} ({protocol} protocol)", outcome))
        if not _row("", outcome)["exactly_once"]:
            break
    return ran


def _digest(service: Callable, accounting_reads: str, results: pd.DataFrame) -> str:
    """Ties a results table to the code and rows it came from: edited, it is measured again."""
    blob = json.dumps([learner.code_of(service), service.__name__, accounting_reads,
                       results.to_dict("records")], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@exercise("10_capstone")
def check_capstone(service: Callable, accounting_reads: str,
                   results: pd.DataFrame | None = None, bootstrap: str | None = None) -> Verdict:
    """10 · the verdict: exact at every named point and the wire, then under production's
    faults. ``results`` from ``run_capstone`` with the same code are reused; otherwise (or
    if the code or the table changed since) the points run again."""
    try:
        validate(service, accounting_reads)
    except ValueError as exc:
        return check(False, "", str(exc))
    started = time.monotonic()
    if bootstrap is None and results is not None:
        # the table's cluster: its production runs, started with the points, are the
        # verdict's (the notebook passes the lab's address to run_capstone only)
        bootstrap = results.attrs.get("bootstrap")
    if results is None or results.attrs.get("digest") != _digest(service, accounting_reads,
                                                                  results):
        results = run_capstone(service, accounting_reads, bootstrap)
    bad = results[~results["exactly_once"]]
    if not bad.empty:
        _stop_pending()
        findings = "; ".join(
            f"{row.experiment}: " + (", ".join([*(f"{k.replace('_', ' ')} {getattr(row, k)}"
                                                  for k in ("lost", "charged_twice",
                                                            "aborted_visible")
                                                  if getattr(row, k)),
                                                *filter(None, [row.findings])])
                                     or "not exactly once")
            for row in bad.itertuples())
        hints = point_hints(service_code(service), accounting_reads, results)
        return check(False, "", f"{len(bad)} of {len(results)} experiments are not "
                                f"exactly-once. {findings}." +
                     (" Hints: " + " | ".join(hints) if hints else ""))
    pending = _PENDING.pop(_key(service, accounting_reads, bootstrap), None)
    ran, broken = [], None
    with _Elapsed("The verdict", started) as clock:
        for label, run in under_production(service, accounting_reads, bootstrap, pending,
                                           on_start=clock.now):
            ran.append(label)
            if not _row("", run)["exactly_once"]:
                broken = (label, run)  # the last one broken names the kind of fault
    if broken is not None:
        label, run = broken
        hints = [KIND_HINTS[label.rsplit(" (", 1)[0]]] + \
            [FINDING_HINTS[f] for f in findings_of(run) if f in FINDING_HINTS]
        return check(False, "", f"every named point was exact, but not "
                                f"{finding_text(label, run)}. Hint: " + " | ".join(hints))
    protocols = " and the ".join(label.split("(")[-1].rstrip(")") for label in ran)
    return check(True, f"all {len(results)} runs at the named points, the wire and the commit "
                       f"exactly-once, then production's faults on the {protocols}: no payment "
                       "lost, none charged twice, no aborted payment visible, no transaction "
                       "left open "
                       f"({time.monotonic() - started:.0f} s).", "")
