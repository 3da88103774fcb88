"""10 · capstone: make the payments service exactly-once. The learner writes the loop; the
check is the audit.

The service is the learner's function (the notebook's exercise cell: the team's
at-least-once loop to start with), run by the lab as the consume-transform-produce worker,
payments in, payments with their card fee out. ``run_capstone`` runs it on data/payments.csv
once per crash point its code passes (killed there on the second batch, restarted), plus
once with a lost produce acknowledgement, and audits each run as accounting reads the
ledger (``accounting_reads``). ``check_capstone`` turns the findings into a verdict whose
hints point at what each finding implicates, never at the code that fixes it. A service that
survives every named point is then put under ``labkit torture`` (``torture_service``): the
same function, SIGKILLed at random moments, judged by what its output topic holds.
"""
from __future__ import annotations

import ast
import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from labkit.experiments import registry, scenarios
from labkit.kafka import cluster as lab
from labkit.pipelines import data, learner
from labkit.torture import apps, harness
from labkit.checking.record import RunRecord
from labkit.exercises import Verdict, check, exercise

SCENARIO = "consume-transform-produce"
PAYMENTS = 300  # all of data/payments.csv
LOST_ACK = "drop-ack:produce:1"  # the broker writes the first produce request, its ack is lost
ACCOUNTING_READS = ("read_committed", "read_uncommitted")
# The torture after the named points: 3 SIGKILLs, each 0.1-0.4 s after the loop's first
# offset commit since its (re)start, so each lands inside the loop's work, not during a
# restart; 600 generated payments give every kill a batch to interrupt.
TORTURE = {"input": 3000, "kills": 3, "seed": 10, "kill_after_s": (0.2, 0.6),
           "kill_clock": "commit", "timeout_s": 120}
# Points every version of the loop has (it polls, writes half a batch, finishes a batch):
# without them the audit could not crash it where duplicates and losses come from.
REQUIRED_POINTS = ("after-poll-before-process", "mid-batch", "after-commit")


def known_points() -> list[str]:
    """Every crash point the scenario knows, the exactly-once path's first."""
    order = [*scenarios.crash_points(SCENARIO, "exactly_once"),
             *scenarios.crash_points(SCENARIO, "at_least_once"),
             *scenarios.crash_points(SCENARIO, "at_most_once")]
    return list(dict.fromkeys(order))


def service_code(service: Callable) -> str:
    """The text of the service's own definition: the last ``def`` of its name in its cell (a
    cell may define it twice, e.g. the team's version and a fix below it; the last one runs)."""
    cell = learner.code_of(service)
    defs = [node for node in ast.parse(cell).body
            if isinstance(node, ast.FunctionDef) and node.name == service.__name__]
    if not defs:
        raise ValueError(f"no 'def {service.__name__}' found in the cell that defines it")
    return ast.get_source_segment(cell, defs[-1]) or ""


def crash_points_in(service: Callable) -> list[str]:
    """The named crash points the service's code passes (its ``crash_point("...")`` calls),
    in the order they appear in it."""
    calls = sorted((node.lineno, node.col_offset, node.args[0].value)
                   for node in ast.walk(ast.parse(service_code(service)))
                   if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "crash_point"
                   and node.args and isinstance(node.args[0], ast.Constant))
    known = set(known_points())
    return list(dict.fromkeys(name for _, _, name in calls if name in known))


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


def experiments(service: Callable) -> list[tuple[str | None, str | None]]:
    """(crash point, fault) pairs: every crash point the service's code passes, a lost ack."""
    return [(p, None) for p in crash_points_in(service)] + [(None, LOST_ACK)]


def _guarantee_for(point: str | None) -> str:
    """The scenario's guarantee whose path has ``point`` (the audit only labels with it)."""
    for guarantee in ("exactly_once", "at_least_once", "at_most_once"):
        if point is None or point in scenarios.crash_points(SCENARIO, guarantee):
            return guarantee
    raise ValueError(f"unknown crash point {point!r}")


def run_one(service: Callable, accounting_reads: str, crash_at: str | None = None,
            fault: str | None = None, bootstrap: str | None = None, payments: int = PAYMENTS,
            watch: Callable | None = None) -> scenarios.ScenarioRun:
    """One run of the learner's service, crashed and/or faulted, audited as accounting reads."""
    validate(service, accounting_reads)
    return registry.run(SCENARIO, guarantee=_guarantee_for(crash_at), pipeline=service,
                        crash_at=crash_at, fault=fault, cluster=bootstrap,
                        inputs=data.load_csv("payments")[:payments],
                        isolation=accounting_reads, watch=watch)


def run_capstone(service: Callable, accounting_reads: str, bootstrap: str | None = None,
                 payments: int = PAYMENTS, watch: Callable | None = None) -> pd.DataFrame:
    """Run the service under every experiment and audit each run: one row per experiment."""
    validate(service, accounting_reads)
    rows = []
    for crash_at, fault in experiments(service):
        run = run_one(service, accounting_reads, crash_at, fault, bootstrap, payments, watch)
        r = run.report
        rows.append({"experiment": f"crash at {crash_at}" if crash_at else "lost produce ack",
                     "payments": r.produced, "lost": r.lost, "charged_twice": r.duplicated,
                     "reordered": r.reordered, "aborted_visible": r.aborted_visible,
                     "exactly_once": r.exactly_once})  # the lab's one verdict (order included)
    results = pd.DataFrame(rows)
    results.attrs["digest"] = _digest(service, accounting_reads, results)
    return results


def torture_service(service: Callable, bootstrap: str | None = None) -> RunRecord:
    """The service under ``labkit torture``: its cell's text in a file, run as an app of its
    own (``apps.function_command``), SIGKILLed at random moments (``TORTURE``) and restarted,
    its output audited as a read_committed consumer reads it."""
    with tempfile.TemporaryDirectory(prefix="capstone-") as workdir:
        code_file = Path(workdir) / "service.py"
        code_file.write_text(learner.code_of(service))
        return harness.torture(apps.function_command(code_file, service.__name__),
                               cluster=lab.ExternalCluster(bootstrap) if bootstrap else None,
                               **TORTURE)


def _digest(service: Callable, accounting_reads: str, results: pd.DataFrame) -> str:
    """Ties a results table to the code and rows it came from: edited, it is measured again."""
    blob = json.dumps([learner.code_of(service), service.__name__, accounting_reads,
                       results.to_dict("records")], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _hints(code: str, accounting_reads: str, results: pd.DataFrame) -> list[str]:
    bad = results[~results["exactly_once"]]
    crashes = bad[bad["experiment"].str.startswith("crash")]
    ack = bad[bad["experiment"] == "lost produce ack"]
    transactional = "send_offsets_to_transaction" in code
    hints = []
    if (bad["lost"] > 0).any():
        hints.append("payments were LOST: something marked a batch done (its input offsets "
                     "committed) before its output was safely written")
    if not transactional and (crashes["charged_twice"] > 0).any():
        hints.append("a crash between writing the ledger and committing the input offsets "
                     "repeats the batch: the two must commit together, atomically")
    if (crashes["charged_twice"] == 1).any():
        hints.append("one payment charged twice per restart: after a restart, is the committed "
                     "offset the last payment processed or the next one to read?")
    if not ack.empty and (ack["charged_twice"] > 0).any():
        hints.append("a lost ack was retried and written twice: the broker only drops such "
                     "retries for an idempotent producer")
    if (bad["aborted_visible"] > 0).any():
        hints.append("accounting saw payments of ABORTED transactions: look at how it reads "
                     f"the ledger (accounting_reads = {accounting_reads!r})")
    return hints


@exercise("10_capstone")
def check_capstone(service: Callable, accounting_reads: str,
                   results: pd.DataFrame | None = None, bootstrap: str | None = None) -> Verdict:
    """10 · the verdict: exactly-once under every crash point and a lost ack, by the audit.

    ``results`` from ``run_capstone`` with the same code are reused; otherwise (or if the
    code or the table changed since) the experiments run again.
    """
    try:
        validate(service, accounting_reads)
    except ValueError as exc:
        return check(False, "", str(exc))
    if results is None or results.attrs.get("digest") != _digest(service, accounting_reads,
                                                                  results):
        results = run_capstone(service, accounting_reads, bootstrap)
    bad = results[~results["exactly_once"]]
    if bad.empty:
        tortured = torture_service(service, bootstrap)
        r = tortured.report
        if tortured.verdict != "exactly once":
            return check(False, "", f"all {len(results)} experiments audited exactly-once, but "
                                    f"under labkit torture ({tortured.kills} SIGKILLs at random "
                                    f"moments) {r.produced} payments gave lost {r.lost}, "
                                    f"charged twice {r.duplicated}: {tortured.verdict}. Hint: "
                                    "the named points are not the only places a process can "
                                    "die; what does your loop leave half done between them?")
        return check(True, f"all {len(results)} experiments audited exactly-once: no payment "
                           "lost, none charged twice, no aborted payment visible downstream. "
                           f"Under labkit torture ({tortured.kills} SIGKILLs at random moments, "
                           f"{tortured.restarts} restarts) the ledger was exactly once too: "
                           f"{r.produced} payments, each written once.", "")
    findings = "; ".join(
        f"{row.experiment}: " + (", ".join(f"{k.replace('_', ' ')} {getattr(row, k)}"
                                           for k in ("lost", "charged_twice", "aborted_visible",
                                                     "reordered")
                                           if getattr(row, k)) or "not exactly once")
        for row in bad.itertuples())
    hints = _hints(service_code(service), accounting_reads, results)
    return check(False, "", f"{len(bad)} of {len(results)} experiments are not exactly-once. "
                            f"{findings}." + (" Hints: " + " | ".join(hints) if hints else ""))
