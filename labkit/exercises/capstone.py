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
at the cause, never at the code that fixes it.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import json
import threading
import time
from collections.abc import Callable, Iterator

import pandas as pd

from labkit.checking.record import RunRecord
from labkit.exercises import Verdict, check, exercise
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
COUNTED = ("lost-write", "duplicate", "aborted-read")  # the table's columns say these


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


def run_one(service: Callable, accounting_reads: str, crash_at: str | tuple | None = None,
            fault: str | None = None, bootstrap: str | None = None, payments: int = PAYMENTS,
            phase: str = "point", **options) -> RunRecord:
    """One judged run of the learner's service (see ``labkit.experiments.judge``)."""
    validate(service, accounting_reads)
    if crash_at == COMMITTING:
        crash_at, fault = None, COMMIT_KILL
    if phase == "point" and not crash_at and fault is None:
        fault = WIRE_RUN
    options.setdefault("partitions", PARTITIONS)
    return registry.run("judge", phase=phase, pipeline=service, crash_at=crash_at or None,
                        fault=fault if phase == "point" else None, cluster=bootstrap,
                        records=payments, isolation=accounting_reads, **options)


def _findings_of(run: RunRecord) -> list[str]:
    """What the judge found besides the table's counts: its findings, the audit's other
    anomalies (e.g. an aborted input read)."""
    return [*run.findings, *(a for a in run.report.anomalies if a not in COUNTED)]


def _row(label: str, run: RunRecord) -> dict:
    r = run.report
    found = _findings_of(run)
    return {"experiment": label, "payments": r.produced, "lost": r.lost,
            "charged_twice": r.duplicated, "aborted_visible": r.aborted_visible,
            "findings": ", ".join(found), "exactly_once": r.exactly_once and not found}


def run_capstone(service: Callable, accounting_reads: str, bootstrap: str | None = None,
                 payments: int = PAYMENTS, watch: Callable | None = None,
                 split: bool = False) -> pd.DataFrame:
    """The named points (two instances, six partitions; two points a run) and the wire:
    one row a run. ``watch`` (a live view of the run's topics) follows the first run;
    ``split``: a run that is not exact is run again point by point, its rows naming one
    point each."""
    validate(service, accounting_reads)
    rows = []
    planned = experiments(service)
    with _Elapsed("The named points") as clock:
        for n, points in enumerate(planned, 1):
            clock.now(f"{label(points)} (run {n} of {len(planned)})")
            run = run_one(service, accounting_reads, points, bootstrap=bootstrap,
                          payments=payments, **({"watch": watch} if watch and n == 1 else {}))
            if not split or _row("", run)["exactly_once"] or len(points) < 2:
                rows.append(_row(label(points), run))
                continue
            for point in points:  # which of the two: each alone
                clock.now(f"{label((point,))} alone")
                rows.append(_row(label((point,)), run_one(service, accounting_reads, (point,),
                                                           bootstrap=bootstrap,
                                                           payments=payments)))
    results = pd.DataFrame(rows)
    results.attrs["digest"] = _digest(service, accounting_reads, results)
    return results


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


def under_production(service: Callable, accounting_reads: str, bootstrap: str | None = None,
                     seed: int = 10, on_start: Callable[[str], None] = lambda what: None
                     ) -> Iterator[tuple[str, RunRecord]]:
    """The seeded schedule of production's faults, once per group protocol; where it breaks
    the loop, each kind of fault alone until one does: (what ran, its record), in order.
    ``on_start(what)`` is told what runs next."""
    for protocol in schedules(service):
        label = f"production's faults ({protocol} protocol)"
        on_start(label)
        run = run_one(service, accounting_reads, phase="schedule", bootstrap=bootstrap,
                      instances=3, payments=600, seed=seed, group_protocol=protocol)
        yield label, run
        if _row("", run)["exactly_once"]:
            continue
        for kind in KINDS:
            label = f"{PHASES[kind]} ({protocol} protocol)"
            on_start(label)
            alone = run_one(service, accounting_reads, phase=kind, bootstrap=bootstrap,
                            seed=seed, group_protocol=protocol)
            yield label, alone
            if not _row("", alone)["exactly_once"]:
                return
        return


def _digest(service: Callable, accounting_reads: str, results: pd.DataFrame) -> str:
    """Ties a results table to the code and rows it came from: edited, it is measured again."""
    blob = json.dumps([learner.code_of(service), service.__name__, accounting_reads,
                       results.to_dict("records")], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _point_hints(code: str, accounting_reads: str, results: pd.DataFrame) -> list[str]:
    bad = results[~results["exactly_once"]]
    crashes = bad[bad["experiment"].str.startswith("crash")]
    wire = bad[~bad["experiment"].str.startswith("crash")]
    transactional = "send_offsets_to_transaction" in code
    hints = []
    if (bad["lost"] > 0).any():
        hints.append("payments were LOST: something marked a batch done (its input offsets "
                     "committed) before its output was safely written")
    if not transactional and (crashes["charged_twice"] > 0).any():
        hints.append("a crash between writing the ledger and committing the input offsets "
                     "repeats the batch: the two must commit together, atomically")
    if transactional and (crashes["charged_twice"] > 0).any():
        hints.append("after a restart, is the committed offset of each partition the last "
                     "payment processed or the next one to read, and does it cover every "
                     "partition the batch was read from?")
    if not wire.empty and (wire["charged_twice"] > 0).any():
        hints.append("a lost ack was retried and written twice: the broker only drops such "
                     "retries for an idempotent producer")
    if (bad["aborted_visible"] > 0).any():
        hints.append("accounting saw payments of ABORTED transactions: look at how it reads "
                     f"the ledger (accounting_reads = {accounting_reads!r})")
    named = {f for found in bad["findings"] for f in found.split(", ") if f}
    return hints + [FINDING_HINTS[f] for f in sorted(named) if f in FINDING_HINTS]


# What each kind of fault implicates when it breaks a loop (causes, never the fix).
KIND_HINTS = {
    "production's faults": "the named points are not the only places a process can die, nor "
                           "a crash the only thing production does",
    PHASES["kills"]: "what does your loop leave half done between two named points, or when "
                     "it dies with its output or its commit on the wire?",
    PHASES["wire"]: "when the broker refused a record, was the whole transaction given up and "
                    "its batch read again from where it began?",
    PHASES["rebalance"]: "when the group moved partitions between instances, did the offsets "
                         "sent with a batch say where every partition it read from stands?",
    PHASES["zombie"]: "a frozen instance came back after its partitions had moved and "
                      "finished its transaction: could the group coordinator tell it was out "
                      "of date?",
    PHASES["offsets"]: "when the offsets were refused, was the transaction aborted and were "
                       "the partitions read again from their committed offsets, all of them?",
    PHASES["fenced"]: "an instance was fenced (a fatal error): what did it do next?",
}
FINDING_HINTS = {
    "hanging-transaction": "a transaction stayed open after its instance was gone: every "
                           "read_committed reader of its partitions waited for it",
    "fenced-ran-on": "an instance went on after it was fenced, beside the one that took its "
                     "place",
    "abortable-raised": "an instance died of an error that only asked for its transaction to "
                        "be aborted: what became of the batch it was in?",
    "offsets-behind": "the input's committed offsets stopped short of what the service had "
                      "processed: a restart reads those payments again",
    "aborted-input-read": "the ledger holds payments an upstream producer ABORTED: how does "
                          "the service read its input?",
}


def _finding_text(label: str, run: RunRecord) -> str:
    r = run.report
    found = [f"{k.replace('_', ' ')} {v}" for k, v in (("lost", r.lost),
                                                         ("charged_twice", r.duplicated),
                                                         ("aborted_visible", r.aborted_visible))
             if v]
    found += [f"{name} ({', '.join(map(str, run.findings[name]))})" if name in run.findings
              else name for name in _findings_of(run)]
    errors = "; ".join(f"instance {e['instance']} raised {e['raised']}" for e in run.errors)
    return (f"under {label}: {', '.join(found) or 'not exactly once'}"
            + (f" ({errors})" if errors else ""))


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
    if results is None or results.attrs.get("digest") != _digest(service, accounting_reads,
                                                                  results):
        results = run_capstone(service, accounting_reads, bootstrap)
    bad = results[~results["exactly_once"]]
    if not bad.empty:
        findings = "; ".join(
            f"{row.experiment}: " + (", ".join([*(f"{k.replace('_', ' ')} {getattr(row, k)}"
                                                  for k in ("lost", "charged_twice",
                                                            "aborted_visible")
                                                  if getattr(row, k)),
                                                *filter(None, [row.findings])])
                                     or "not exactly once")
            for row in bad.itertuples())
        hints = _point_hints(service_code(service), accounting_reads, results)
        return check(False, "", f"{len(bad)} of {len(results)} experiments are not "
                                f"exactly-once. {findings}." +
                     (" Hints: " + " | ".join(hints) if hints else ""))
    ran, broken = [], None
    with _Elapsed("The verdict", started) as clock:
        for label, run in under_production(service, accounting_reads, bootstrap,
                                           on_start=clock.now):
            ran.append(label)
            if not _row("", run)["exactly_once"]:
                broken = (label, run)  # the last one broken names the kind of fault
    if broken is not None:
        label, run = broken
        hints = [KIND_HINTS[label.rsplit(" (", 1)[0]]] + \
            [FINDING_HINTS[f] for f in _findings_of(run) if f in FINDING_HINTS]
        return check(False, "", f"every named point was exact, but not "
                                f"{_finding_text(label, run)}. Hint: " + " | ".join(hints))
    protocols = " and the ".join(label.split("(")[-1].rstrip(")") for label in ran)
    return check(True, f"all {len(results)} runs at the named points, the wire and the commit "
                       f"exactly-once, then production's faults on the {protocols}: no payment "
                       "lost, none charged twice, no aborted payment visible, no transaction "
                       "left open "
                       f"({time.monotonic() - started:.0f} s).", "")
