"""07 · stateful exactly-once: the exercise check.

The learner predicts, for each crash point a running count under at_least_once passes,
whether the final counts drift. The check runs the real pipeline, crashed at each point,
and compares the prediction with what the audit measured.
"""
from __future__ import annotations

import pandas as pd

from labkit import experiments
from labkit.experiments import scenarios
from labkit.exercises import Verdict, check, exercise, prediction_gaps

SCENARIO = "running-count"
GUARANTEE = "at_least_once"
RECORDS = 40
# The main experiment already showed this one; the exercise asks about the others.
SHOWN = "after-state-update-before-commit"


def exercise_points() -> tuple[str, ...]:
    return tuple(p for p in scenarios.crash_points(SCENARIO, GUARANTEE) if p != SHOWN)


def measure_drift(points: tuple[str, ...], bootstrap: str | None = None,
                  records: int = RECORDS) -> pd.DataFrame:
    """Run the running count under at_least_once, crashed at each point; one audited row each."""
    rows = []
    for point in points:
        report = experiments.run(SCENARIO, guarantee=GUARANTEE, crash_at=point,
                                 records=records,
                                 cluster=bootstrap).report
        over = sum(max(0, report.state_actual.get(k, 0) - n)
                   for k, n in report.state_expected.items())
        rows.append({"crash_at": point, "duplicated": report.duplicated,
                     "drifted": not report.state_matches, "over_counted": over})
    return pd.DataFrame(rows)


@exercise("07_stateful_exactly_once")
def check_drift(prediction: dict[str, bool | None], bootstrap: str | None = None) -> Verdict:
    """07 · predict, per crash point, whether at_least_once's counts drift (True) or not."""
    points = exercise_points()
    gaps = prediction_gaps(prediction, points, "True (the counts drift) or False (they stay right)")
    if gaps is not None:
        return gaps
    not_bool = [p for p in points if not isinstance(prediction[p], bool)]
    if not_bool:  # bool("False") is True: a string would be judged as the opposite answer
        return check(False, "", f"use True or False (without quotes) for: {', '.join(not_bool)}.")
    measured = measure_drift(points, bootstrap).set_index("crash_at")
    wrong = [p for p in points if bool(prediction[p]) != bool(measured.loc[p, "drifted"])]
    facts = "; ".join(f"{p}: {'drifted' if measured.loc[p, 'drifted'] else 'right'}"
                      for p in points)
    return check(not wrong,
                 f"measured {facts}. The counts drift exactly when the store was updated "
                 "but the input offsets were not committed yet.",
                 f"{len(wrong)} of {len(points)} predictions differ from the measurement "
                 f"({', '.join(wrong)}). Ask for each point: was the store already updated, "
                 "and were the offsets not yet committed?")
