"""08a and 08b · Spark Structured Streaming: the exercise checks.

08a: the notebook crashed the naive sink between its write and Spark's commit of batch 1 and
found one whole batch (20 rows) duplicated. The learner predicts how many duplicated rows
the naive sink shows when the driver dies at the other two Spark crash points; the check
runs the real query (real Spark, real broker), crashed at each point, and compares the
prediction with what the audit measured.

Also 08a: the learner writes a foreachBatch function that survives the replay; the check
runs it (``pipeline=``) under the same crash into a table keyed
by the payment id, and audits the table.

08b: the learner predicts how many records of aborted transactions reach the batch-id sink
(the lab's copy of the notebook's ``ledger_sink``) when a colleague sets ``isolation.level``
without Spark's ``kafka.`` prefix; the check runs the real query with that option on a
freshly written input (some transactions aborted) and audits the table.
"""
from __future__ import annotations

import pandas as pd

from labkit.exercises import Verdict, check, exercise, prediction_gaps, unanswered
from labkit.pipelines.learner import fingerprint
from labkit.spark.runner import SPARK_CRASH_POINTS
from labkit import experiments
from labkit.spark.scenarios import TASK_FAILURE

SCENARIO = "spark-naive"
GUARANTEE = "at_least_once"
RECORDS = 60  # 3 micro-batches of 20, as in the notebook
SHOWN = "spark-after-sink-before-commit"  # the notebook's own experiment


def exercise_points() -> tuple[str, ...]:
    """The driver crash points other than the one shown (a task failure is not one: it
    needs the Kafka sink, not the naive one)."""
    return tuple(p for p in SPARK_CRASH_POINTS if p not in (SHOWN, TASK_FAILURE))


def measure_duplicates(points: tuple[str, ...], bootstrap: str,
                       records: int = RECORDS) -> pd.DataFrame:
    """Crash the naive sink's query at each point, restart it, audit the table: one row each."""
    rows = []
    for i, point in enumerate(points):
        exp = experiments.run(SCENARIO, cluster=bootstrap, guarantee=GUARANTEE,
                              crash_at=point, records=records, keep_topics=False,
                              keep_workdir=False,
                              spare=i < len(points) - 1)  # no spare worker after the last crash
        timeline = exp.run.timeline
        rows.append({"crash_at": point, "duplicated": exp.report.duplicated,
                     "lost": exp.report.lost,
                     "replayed_batches": list(timeline.loc[timeline["replay"], "batch_id"])})
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


@exercise("08a_spark_checkpoints_and_sinks", "1")
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


TXN_SCENARIO = "spark-txn-input-default"  # the transactional input, read with given options


# A colleague's fix of 08b's input: the consumer setting's name as Kafka documents it,
# without Spark's "kafka." prefix.
UNPREFIXED = {"isolation.level": "read_committed"}


@exercise("08b_spark_kafka_in_and_out")
def check_unprefixed_option(prediction: int | None, bootstrap: str) -> Verdict:
    """08b · predict how many records of aborted transactions reach the batch-id sink's
    table when the source gets ``isolation.level`` without the ``kafka.`` prefix: measured by
    running the query with that option on a fresh input and auditing its table."""
    if unanswered(prediction):
        return check(False, "", "fill in my_aborted_visible (a number of records); then run "
                                "this cell again.")
    if isinstance(prediction, bool) or not isinstance(prediction, int) or prediction < 0:
        return check(False, "", "my_aborted_visible must be a whole number, 0 or more.")
    r = experiments.run(TXN_SCENARIO, cluster=bootstrap, guarantee="exactly_once",
                        crash_at=None, records=RECORDS, spare=False, keep_topics=False,
                        keep_workdir=False, source_options=UNPREFIXED).report
    return check(prediction == r.aborted_visible,
                 f"the audit found {r.aborted_visible} records of aborted transactions in the "
                 f"table ({r.produced} committed ones, lost {r.lost}). Spark hands its Kafka "
                 "consumers only the options named kafka.*, and ignores any other it does not "
                 "know, silently: the Java consumer never saw isolation.level.",
                 "that is not what the run measured. Which of a Kafka source's options reach "
                 "the Java consumer Spark creates, and what does that consumer read when "
                 "isolation.level is not set?")


IDEMPOTENT_SCENARIO = "spark-idempotent"  # its table's key is the payment id, as a real one's
# The syntax tree of naive_sink (08a, section 1), which my_sink starts as a copy of
# (tests/test_spark_learner_code.py checks both cells against it).
NAIVE_SINK = "ee8b7ca68dcdb3e6"


def _refusal(error: Exception) -> str:
    """What went wrong in the learner's sink, in a line that does not change between runs."""
    text = str(error)
    if "UNIQUE constraint failed" in text or "duplicate key value" in text:
        return ("the database refused the replay: batch 1's payments were already in the "
                "table, and its key is the payment id")
    last = [line.strip() for line in text.splitlines() if "Error" in line or "error" in line]
    return f"your sink failed: {(last[-1] if last else text.splitlines()[0])[:200]}"


@exercise("08a_spark_checkpoints_and_sinks", "2")
def check_my_sink(sink, bootstrap: str) -> Verdict:
    """08a · the learner's foreachBatch function, crashed as the notebook crashed the naive
    sink (driver killed after the sink wrote batch 1, before commits/1) into a table keyed
    by the payment id; passes when the audit finds every payment once."""
    if not callable(sink):
        return check(False, "", "my_sink must be a function: def my_sink(batch_df, batch_id, "
                                "db_url, table): ...")
    if fingerprint(sink) == NAIVE_SINK:  # its replay was measured in section 1 already
        return check(False, "", "my_sink is still naive_sink: section 1 showed its replay "
                                "INSERTing batch 1's rows a second time. Change what it "
                                "writes, then run this cell again: the check then crashes "
                                "your sink.")
    try:
        r = experiments.run(IDEMPOTENT_SCENARIO, cluster=bootstrap,
                            guarantee="exactly_once", crash_at=SHOWN,
                            records=RECORDS, spare=False, keep_topics=False,
                            keep_workdir=False, pipeline=sink).report
    except Exception as exc:  # the learner's code, run by Spark: say what it did, briefly
        return check(False, "", f"{_refusal(exc)}. Make the write of a row whose payment id "
                                "is already there replace it (or leave it), not fail.")
    return check(r.exactly_once,
                 f"your sink survived the replay: {r.produced} payments, each once in the "
                 "table. A replay now writes the same rows onto themselves.",
                 f"the audit found {r.lost} lost and {r.duplicated} duplicated. Every row of "
                 "the batch must reach the table, and a row already there must not come twice.")
