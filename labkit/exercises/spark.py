"""08 · Spark Structured Streaming: the exercise check.

The notebook crashed the naive sink between its write and Spark's commit of batch 1 and
found one whole batch (20 rows) duplicated. The learner predicts how many duplicated rows
the naive sink shows when the driver dies at the other two Spark crash points; the check
runs the real query (real Spark, real broker), crashed at each point, and compares the
prediction with what the audit measured.
"""
from __future__ import annotations

import pandas as pd

from labkit.exercises import Verdict, check, prediction_gaps
from labkit.spark.runner import SPARK_CRASH_POINTS
from labkit.spark.scenarios import experiment

SCENARIO = "spark-naive"
GUARANTEE = "at_least_once"
RECORDS = 60  # 3 micro-batches of 20, as in the notebook
SHOWN = "spark-after-sink-before-commit"  # the notebook's own experiment


def exercise_points() -> tuple[str, ...]:
    return tuple(p for p in SPARK_CRASH_POINTS if p != SHOWN)


def measure_duplicates(points: tuple[str, ...], bootstrap: str,
                       records: int = RECORDS) -> pd.DataFrame:
    """Crash the naive sink's query at each point, restart it, audit the table: one row each."""
    rows = []
    for i, point in enumerate(points):
        exp = experiment(SCENARIO, bootstrap, GUARANTEE, point, records,
                         spare=i < len(points) - 1)  # no spare worker after the last crash
        try:
            timeline = exp.run.timeline
            rows.append({"crash_at": point, "duplicated": exp.report.duplicated,
                         "lost": exp.report.lost,
                         "replayed_batches": list(timeline.loc[timeline["replay"], "batch_id"])})
        finally:
            exp.cleanup()
    return pd.DataFrame(rows)


def judge(prediction: dict[str, int], measured: pd.DataFrame) -> Verdict:
    """Compare predicted duplicate counts with measured ones (one row per crash point)."""
    by_point = measured.set_index("crash_at")["duplicated"]
    wrong = [p for p in by_point.index if int(prediction[p]) != int(by_point[p])]
    facts = "; ".join(f"{p}: {by_point[p]} duplicated" for p in by_point.index)
    return check(not wrong,
                 f"measured {facts}. A replay rewrites exactly what reached the sink after the "
                 "last commit: half a batch when the driver died mid-sink, nothing once "
                 "commits/1 was written.",
                 f"{len(wrong)} of {len(by_point)} predictions differ from the measurement "
                 f"({', '.join(wrong)}). Ask for each point: how many rows of batch 1 were in the "
                 "table when the driver died, and was commits/1 already written?")


def check_naive_duplicates(prediction: dict[str, int | None], bootstrap: str) -> Verdict:
    """08 · predict the naive sink's duplicated rows after a crash at each other Spark point."""
    points = exercise_points()
    gaps = prediction_gaps(prediction, points, "a number of duplicated rows")
    if gaps is not None:
        return gaps
    bad = [p for p in points if not isinstance(prediction[p], int) or prediction[p] < 0]
    if bad:
        return check(False, "", f"use a whole number (0 or more) for: {', '.join(bad)}.")
    return judge(prediction, measure_duplicates(points, bootstrap))
