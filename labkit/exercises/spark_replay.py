"""08d · A replay that computes something else: the exercise check.

The notebook ran the review-threshold pipeline (labkit.spark.replay) into an upsert sink
(two attempts mixed) and into Delta with txnVersion (one processing). The learner predicts
whether a *plain* Delta append, under the same crash and the same threshold change, ends with
a table that matches a single processing of each payment; the check runs the real query
(real Spark, real broker, a real SIGKILL) and audits the table.
"""
from __future__ import annotations

from labkit import experiments
from labkit.checking.record import RunRecord
from labkit.exercises import Verdict, check, exercise, unanswered

SINK = "delta-append"
RECORDS = 30  # 3 micro-batches of 10, as in the notebook


def measure(bootstrap: str, records: int = RECORDS) -> RunRecord:
    """The threshold experiment into a plain Delta append (its topic and files removed)."""
    return experiments.run("spark-replay", cluster=bootstrap, sink=SINK, records=records,
                           spare=False)


def judge(prediction: bool, exp: RunRecord) -> Verdict:
    twice = int(exp.output["id"].duplicated().sum())
    outcome = ("one processing" if exp.mixed.valid else
               f"{exp.mixed.count} mixed keys: no single processing")
    return check(prediction is exp.mixed.valid,
                 f"measured: {len(exp.output)} rows, {twice} payments written twice, {outcome}. "
                 "Without txnAppId/txnVersion the replay of batch 1 is appended next to the "
                 "first attempt's rows: what the new threshold lets through is there twice, "
                 "once per threshold version.",
                 "not what the table shows. Ask: without txnAppId/txnVersion, what does Delta do "
                 "with the replayed batch 1, and which threshold did each copy of it see?")


@exercise("08d_spark_replay_that_computes_something_else")
def check_append_replay(prediction: bool | None, bootstrap: str) -> Verdict:
    """08d · does a plain Delta append match a single processing after the threshold change?"""
    if unanswered(prediction):
        return check(False, "", "set my_prediction to True (one processing) or False (mixed), "
                                "then run this cell again.")
    if not isinstance(prediction, bool):
        return check(False, "", f"my_prediction must be True or False, not {prediction!r}.")
    return judge(prediction, measure(bootstrap))
