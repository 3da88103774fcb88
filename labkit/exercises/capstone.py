"""10 · capstone: make the payments pipeline exactly-once. The check is the audit.

The pipeline is the lab's consume-transform-produce app (payments in, payments with their
card fee out); the learner only chooses its settings. ``run_capstone`` runs it on
data/payments.csv once per crash point the chosen guarantee passes, plus once with a lost
produce acknowledgement, and audits each run. ``check_capstone`` turns the findings into a
verdict with hints that point at the setting each finding implicates.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import pandas as pd

from labkit.experiments import registry, scenarios

from labkit.pipelines import data
from labkit.exercises import Verdict, check, exercise

SCENARIO = "consume-transform-produce"
PAYMENTS = 300  # all of data/payments.csv
LOST_ACK = "drop-ack:produce:1"  # the broker writes the first produce request, its ack is lost

CHOICES: dict[str, tuple] = {
    "processing_guarantee": ("at_most_once", "at_least_once", "exactly_once"),
    "enable_idempotence": (True, False),
    "offsets": ("in-transaction", "outside-before-commit", "outside-after-commit"),
    "committed_offset": ("next-to-read", "last-processed"),
    "downstream_isolation": ("read_committed", "read_uncommitted"),
}
STARTING_SETTINGS: dict = {
    "processing_guarantee": "at_least_once",
    "enable_idempotence": True,
    "offsets": "outside-after-commit",
    "committed_offset": "last-processed",
    "downstream_isolation": "read_uncommitted",
}


def starting_settings() -> dict:
    """The unsolved settings the notebook starts from (a fresh copy to edit)."""
    return dict(STARTING_SETTINGS)


def validate(settings: dict) -> None:
    if not isinstance(settings, dict):
        raise ValueError("settings must be a dict like capstone.starting_settings()")
    missing = [k for k in CHOICES if k not in settings]
    unknown = [k for k in settings if k not in CHOICES]
    if missing or unknown:
        raise ValueError(f"settings need exactly the keys {list(CHOICES)}; missing {missing}, "
                         f"unknown {unknown}")
    for key, value in settings.items():
        if value not in CHOICES[key]:
            raise ValueError(f"settings[{key!r}] = {value!r}: choose one of {CHOICES[key]}")


def experiments(settings: dict) -> list[tuple[str | None, str | None]]:
    """(crash point, fault) pairs: every crash point the guarantee's code passes, a lost ack."""
    points = scenarios.crash_points(SCENARIO, settings["processing_guarantee"])
    return [(p, None) for p in points] + [(None, LOST_ACK)]


def run_one(settings: dict, crash_at: str | None = None, fault: str | None = None,
            bootstrap: str | None = None, payments: int = PAYMENTS,
            watch: Callable | None = None) -> scenarios.ScenarioRun:
    """One run of the payments pipeline with ``settings``, crashed and/or faulted, audited."""
    validate(settings)
    options = {"idempotent": settings["enable_idempotence"], "offsets": settings["offsets"],
               "offset_delta": 1 if settings["committed_offset"] == "next-to-read" else 0}
    return registry.run(SCENARIO, guarantee=settings["processing_guarantee"],
                        crash_at=crash_at, fault=fault, cluster=bootstrap,
                        inputs=data.load_csv("payments")[:payments], options=options,
                        isolation=settings["downstream_isolation"], watch=watch)


def run_capstone(settings: dict, bootstrap: str | None = None, payments: int = PAYMENTS,
                 watch: Callable | None = None) -> pd.DataFrame:
    """Run the pipeline under every experiment and audit each run: one row per experiment."""
    validate(settings)
    rows = []
    for crash_at, fault in experiments(settings):
        r = run_one(settings, crash_at, fault, bootstrap, payments, watch).report
        rows.append({"experiment": f"crash at {crash_at}" if crash_at else "lost produce ack",
                     "payments": r.produced, "lost": r.lost, "charged_twice": r.duplicated,
                     "reordered": r.reordered, "aborted_visible": r.aborted_visible,
                     "exactly_once": r.exactly_once})  # the lab's one verdict (order included)
    results = pd.DataFrame(rows)
    results.attrs["settings"] = dict(settings)
    results.attrs["digest"] = _digest(settings, results)
    return results


def _digest(settings: dict, results: pd.DataFrame) -> str:
    """Ties a results table to its settings and rows, so an edited table is measured again."""
    blob = json.dumps([settings, results.to_dict("records")], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _hints(settings: dict, results: pd.DataFrame) -> list[str]:
    bad = results[~results["exactly_once"]]
    crashes = bad[bad["experiment"].str.startswith("crash")]
    ack = bad[bad["experiment"] == "lost produce ack"]
    g = settings["processing_guarantee"]
    hints = []
    if (bad["lost"] > 0).any():
        hints.append("payments were LOST: something was marked done (offsets committed, or "
                     "fire-and-forget sends) before the work was safely written")
    if g != "exactly_once" and (crashes["charged_twice"] > 0).any():
        hints.append("a crash between writing the output and committing the input offsets "
                     "repeats the work: the two must commit together, in one transaction")
    if not ack.empty and g != "exactly_once" and not settings["enable_idempotence"]:
        hints.append("a lost ack was retried and written twice: the broker only drops such "
                     "retries for an idempotent producer")
    if g == "exactly_once" and settings["offsets"] != "in-transaction" and not crashes.empty:
        hints.append("input offsets committed outside the transaction can disagree with the "
                     "output after a crash: where should they be committed?")
    if settings["committed_offset"] == "last-processed" and (crashes["charged_twice"] > 0).any():
        hints.append("after a restart, is the committed offset the last record processed or "
                     "the next one to read?")
    if (bad["aborted_visible"] > 0).any():
        hints.append("the downstream ledger saw payments of ABORTED transactions: how does it "
                     "read the output?")
    return hints


@exercise("10_capstone")
def check_capstone(settings: dict, results: pd.DataFrame | None = None,
                   bootstrap: str | None = None) -> Verdict:
    """10 · the verdict: exactly-once under every crash point and a lost ack, by the audit.

    ``results`` from ``run_capstone`` with the same settings are reused; otherwise (or if
    the settings changed since) the experiments run again.
    """
    try:
        validate(settings)
    except ValueError as exc:
        return check(False, "", str(exc))
    if results is None or results.attrs.get("digest") != _digest(settings, results):
        results = run_capstone(settings, bootstrap)
    bad = results[~results["exactly_once"]]
    if bad.empty:
        return check(True, f"all {len(results)} experiments audited exactly-once: no payment "
                           "lost, none charged twice, no aborted payment visible downstream.", "")
    findings = "; ".join(
        f"{row.experiment}: " + ", ".join(f"{k.replace('_', ' ')} {getattr(row, k)}"
                                          for k in ("lost", "charged_twice", "aborted_visible")
                                          if getattr(row, k))
        for row in bad.itertuples())
    hints = _hints(settings, results)
    return check(False, "", f"{len(bad)} of {len(results)} experiments are not exactly-once. "
                            f"{findings}." + (" Hints: " + " | ".join(hints) if hints else ""))
