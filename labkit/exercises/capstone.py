"""10 · capstone: make the payments service exactly-once. The learner writes the loop; the
judge (``labkit.experiments.judge``) runs it as production does and audits what it wrote.

Fast feedback first. ``run_capstone`` runs the learner's function as two instances of one
group over three partitions, each instance SIGKILLed at a named crash point its code passes
(two points a run), then once with a lost produce acknowledgement and a refused record, and
audits each run as accounting reads the ledger (``accounting_reads``): a table, a row per
run; a run that fails is run again point by point, so each row names one point. Once every
row is exact, ``check_capstone`` puts the loop under production's faults, seeded: three
instances, the input arriving while they work, SIGKILLs at random moments, a member joining
and one leaving, a zombie, an abortable error on a Produce and on the offsets, a successor
fencing an instance; under both group protocols when the function takes ``group_protocol``.
A schedule that breaks the loop is run again one kind of fault at a time until the kind
that breaks it is found. The verdict names it and what it found, with a hint that points
at the cause, never at the code that fixes it.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import json
import time
from collections.abc import Callable, Iterator

import pandas as pd

from labkit.checking.record import RunRecord
from labkit.exercises import Verdict, check, exercise
from labkit.experiments import registry
from labkit.experiments.judge import PHASES
from labkit.faults.crashpoints import CRASH_POINTS
from labkit.pipelines import learner
from labkit.progress import status

PAYMENTS = 300
ACCOUNTING_READS = ("read_committed", "read_uncommitted")
WIRE = "drop-ack:produce:1"  # the broker writes a produce request; its ack is lost
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
    the wire run (a lost ack, a refused record)."""
    found = crash_points_in(service)
    return [tuple(found[i:i + 2]) for i in range(0, len(found), 2)] + [()]


def _label(points: tuple[str, ...]) -> str:
    return " and ".join(f"crash at {p}" for p in points) if points else \
        "lost produce ack, refused record"


def run_one(service: Callable, accounting_reads: str, crash_at: str | tuple | None = None,
            fault: str | None = None, bootstrap: str | None = None, payments: int = PAYMENTS,
            phase: str = "point", **options) -> RunRecord:
    """One judged run of the learner's service (see ``labkit.experiments.judge``)."""
    validate(service, accounting_reads)
    if phase == "point" and not crash_at and fault is None:
        fault = WIRE + "+error:produce:3:INVALID_RECORD"
    return registry.run("judge", phase=phase, pipeline=service, crash_at=crash_at or None,
                        fault=fault if phase == "point" else None, cluster=bootstrap,
                        records=payments, isolation=accounting_reads, **options)


def _row(label: str, run: RunRecord) -> dict:
    r = run.report
    return {"experiment": label, "payments": r.produced, "lost": r.lost,
            "charged_twice": r.duplicated, "aborted_visible": r.aborted_visible,
            "exactly_once": r.exactly_once and not run.findings}


def run_capstone(service: Callable, accounting_reads: str, bootstrap: str | None = None,
                 payments: int = PAYMENTS, watch: Callable | None = None) -> pd.DataFrame:
    """The named points (two instances, three partitions) and the wire: one row a run; a
    run that is not exact is run again point by point, its rows naming one point each."""
    validate(service, accounting_reads)
    rows = []
    for points in experiments(service):
        run = run_one(service, accounting_reads, points, bootstrap=bootstrap, payments=payments)
        if _row("", run)["exactly_once"] or len(points) < 2:
            rows.append(_row(_label(points), run))
            continue
        for point in points:  # which of the two: each alone
            rows.append(_row(_label((point,)), run_one(service, accounting_reads, (point,),
                                                       bootstrap=bootstrap, payments=payments)))
    results = pd.DataFrame(rows)
    results.attrs["digest"] = _digest(service, accounting_reads, results)
    return results


def schedules(service: Callable) -> list[str]:
    """The group protocols the schedule runs under: both when the service takes
    ``group_protocol`` (KIP-848's consumer protocol moves partitions differently)."""
    takes = "group_protocol" in inspect.signature(service).parameters
    return ["classic", "consumer"] if takes else ["classic"]


def under_production(service: Callable, accounting_reads: str, bootstrap: str | None = None,
                     seed: int = 10) -> Iterator[tuple[str, RunRecord]]:
    """The seeded schedule of production's faults, once per group protocol; where it breaks
    the loop, each kind of fault alone until one does: (what ran, its record), in order."""
    for protocol in schedules(service):
        run = run_one(service, accounting_reads, phase="schedule", bootstrap=bootstrap,
                      instances=3, payments=600, seed=seed, group_protocol=protocol)
        yield f"production's faults ({protocol} protocol)", run
        if _row("", run)["exactly_once"]:
            continue
        for kind in KINDS:
            alone = run_one(service, accounting_reads, phase=kind, bootstrap=bootstrap,
                            seed=seed, group_protocol=protocol)
            yield f"{PHASES[kind]} ({protocol} protocol)", alone
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
    return hints


# What each kind of fault implicates when it breaks a loop (causes, never the fix).
KIND_HINTS = {
    "production's faults": "the named points are not the only places a process can die, nor "
                           "a crash the only thing production does",
    PHASES["kills"]: "what does your loop leave half done between two named points?",
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
}


def _finding_text(label: str, run: RunRecord) -> str:
    r = run.report
    found = [f"{k.replace('_', ' ')} {v}" for k, v in (("lost", r.lost),
                                                         ("charged_twice", r.duplicated),
                                                         ("aborted_visible", r.aborted_visible))
             if v]
    found += [f"{name} ({', '.join(map(str, examples))})"
              for name, examples in run.findings.items()]
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
            f"{row.experiment}: " + (", ".join(f"{k.replace('_', ' ')} {getattr(row, k)}"
                                               for k in ("lost", "charged_twice",
                                                         "aborted_visible")
                                               if getattr(row, k)) or "not exactly once")
            for row in bad.itertuples())
        hints = _point_hints(service_code(service), accounting_reads, results)
        return check(False, "", f"{len(bad)} of {len(results)} experiments are not "
                                f"exactly-once. {findings}." +
                     (" Hints: " + " | ".join(hints) if hints else ""))
    ran, broken = [], None
    with status("The verdict: production's faults") as say:
        for label, run in under_production(service, accounting_reads, bootstrap):
            ran.append(label)
            say(f"The verdict: {label} done after {time.monotonic() - started:.0f} s")
            if not _row("", run)["exactly_once"]:
                broken = (label, run)  # the last one broken names the kind of fault
    if broken is not None:
        label, run = broken
        hints = [KIND_HINTS[label.rsplit(" (", 1)[0]]] + \
            [FINDING_HINTS[f] for f in run.findings if f in FINDING_HINTS]
        return check(False, "", f"every named point was exact, but not "
                                f"{_finding_text(label, run)}. Hint: " + " | ".join(hints))
    return check(True, f"all {len(results)} point experiments exactly-once, then under "
                       f"{' and '.join(ran)}: no payment lost, none charged twice, no "
                       "aborted payment visible, no transaction left open "
                       f"({time.monotonic() - started:.0f} s).", "")
