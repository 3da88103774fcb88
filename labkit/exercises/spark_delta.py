"""08c · Delta Lake's idempotent writes: the exercise check.

The notebook killed the driver after the sink's Delta commit of batch 1 and before Spark's
``commits/1``: the plain append committed the replay again (4 commits, 10 duplicated rows).
The learner predicts what the same plain append's table shows when the driver dies at
``spark-mid-sink`` instead, before the write; the check runs the real query (real Spark,
real broker, a real SIGKILL), reads the table's history and audits it.
"""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered
from labkit import experiments

SCENARIO, GUARANTEE = "spark-delta", "at_least_once"  # at_least_once: the plain append
CRASH_AT = "spark-mid-sink"
RECORDS = 30  # 3 micro-batches of 10, as in the notebook
ANSWERS = ("commits", "duplicated")


def measure(bootstrap: str, records: int = RECORDS) -> dict[str, int]:
    """The plain append killed at spark-mid-sink: its table's commits (as the audit read
    the table) and the audit's duplicated rows (the run's topics and files removed)."""
    exp = experiments.run(SCENARIO, cluster=bootstrap, guarantee=GUARANTEE,
                          crash_at=CRASH_AT, records=records, spare=False, keep_topics=False,
                          keep_workdir=False)
    return {"commits": len(exp.table_history), "duplicated": exp.report.duplicated}


def judge(prediction: dict[str, int], measured: dict[str, int]) -> Verdict:
    wrong = [k for k in ANSWERS if prediction[k] != measured[k]]
    return check(not wrong,
                 f"measured: {measured['commits']} commits, {measured['duplicated']} duplicated "
                 "rows. Killed before the write, batch 1's first attempt left nothing in the "
                 "table: a Delta commit is all of a batch or none of it, so the replay is its "
                 "only copy, even without txnVersion.",
                 f"{' and '.join(wrong)}: not what the table shows. Ask: killed before the "
                 "write, what did batch 1's first attempt leave in the table?")


@exercise("08c_spark_delta_idempotent_writes")
def check_append_mid_sink(prediction: dict[str, int | None] | None, bootstrap: str) -> Verdict:
    """08c · the plain append killed at spark-mid-sink: predict its commits and duplicates."""
    if not isinstance(prediction, dict) or set(prediction) != set(ANSWERS):
        return check(False, "", 'my_prediction must be {"commits": ..., "duplicated": ...}.')
    if any(unanswered(v) for v in prediction.values()):
        return check(False, "", "replace each None with a number, then run this cell again.")
    if not all(isinstance(v, int) and v >= 0 for v in prediction.values()):
        return check(False, "", "each answer is a count: a whole number, 0 or more.")
    return judge(prediction, measure(bootstrap))
