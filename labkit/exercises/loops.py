"""What the Core notebooks' code exercises share: the learner's copy of a loop, told apart
from the one on screen, and run by the lab at every crash point its code passes.

A Core exercise starts from a copy of code the notebook showed;
``labkit.exercises.not_changed`` tells an unchanged copy from an edited one, so a check says
"change it first" before running anything. ``crash_each`` runs the learner's function as a scenario's worker
(``labkit.pipelines.learner``: the text of its cell is what the worker runs), once per
``crash_point("...")`` its own definition calls, killed there on its 2nd batch and restarted,
and returns the audit of each run. A worker that fails with an error is a ``LoopFailed``
whose message is the error's last line, for a hint.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from labkit.checking.audit import AuditReport
from labkit.exercises import Verdict, check
from labkit.pipelines.learner import LearnerCodeError, crash_points_in

GUARANTEES = ("at_most_once", "at_least_once", "exactly_once")  # the audit only labels with one


class LoopFailed(RuntimeError):
    """The learner's loop stopped with an error of its own (not the lab's crash)."""


@dataclass(frozen=True)
class Crashed:
    point: str  # where the worker was killed, on its 2nd batch
    report: AuditReport


def crash_each(function: Callable, scenario: str, bootstrap: str, points: Sequence[str],
               records: int = 40) -> list[Crashed]:
    """Run ``function`` as ``scenario``'s worker once per crash point of ``points``, killed
    there on its 2nd batch of ``records`` and restarted; the audit of each run."""
    from labkit import experiments
    from labkit.faults.runner import WorkerFailed

    runs = []
    for point in points:
        guarantee = next(g for g in GUARANTEES if point in experiments.crash_points(scenario, g))
        try:
            run = experiments.run(scenario, guarantee=guarantee, crash_at=point, records=records,
                                  pipeline=function, cluster=bootstrap, keep_topics=False)
        except (WorkerFailed, LearnerCodeError) as exc:
            raise LoopFailed(last_line(str(exc))) from None
        runs.append(Crashed(point, run.report))
    return runs


def crash_judged(function: Callable, label: str, scenario: str, bootstrap: str,
                 required: Sequence[str], lost_hint: str,
                 records: int = 40) -> list[Crashed] | Verdict:
    """``function`` (the learner's ``label``) crashed at every point of ``scenario`` its code
    passes (``crash_each``), or a "Not yet" that says why not: a crash point of ``required``
    no longer called, the loop failing with an error of its own, or a crash that lost
    payments (where, then ``lost_hint``: a question, not the fix)."""
    from labkit import experiments

    points = crash_points_in(function, experiments.crash_points(scenario))
    missing = [p for p in required if p not in points]
    if missing:
        return check(False, "", f"{label} no longer calls crash_point() at {', '.join(missing)}: "
                                "keep the loop's crash_point lines, so the lab can kill it there.")
    try:
        runs = crash_each(function, scenario, bootstrap, points, records)
    except LoopFailed as failed:
        return check(False, "", f"{label} stopped with an error in the lab's worker: {failed}")
    if killed(runs, "lost", "lost"):
        return check(False, "", f"{killed(runs, 'lost', 'lost')}. {lost_hint}")
    return runs


def killed(runs: Sequence[Crashed], count: str, what: str) -> str:
    """The runs whose audit counted some ``count`` ("lost", "duplicated"), in words."""
    return "; ".join(f"killed at {r.point}: {getattr(r.report, count)} {what}" for r in runs
                     if getattr(r.report, count))


def last_line(text: str) -> str:
    """The line of an error's text that says what went wrong (a traceback's last), shortened."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else text)[:200]
