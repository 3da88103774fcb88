"""08a and 08b · Spark Structured Streaming: the exercise checks and the experiment hooks the
notebooks use, on real Spark and the real broker."""
from __future__ import annotations

from contextlib import contextmanager

import pandas as pd
import pytest

from labkit.exercises.spark import (check_naive_duplicates, check_unprefixed_option,
                                    exercise_points, judge)
from labkit.spark import runner
from labkit import experiments
from tests.solution_code import solution_scope


def solution_prediction() -> dict:
    return solution_scope("08a_spark_checkpoints_and_sinks")["my_prediction"]


def test_a_wrong_prediction_names_its_crash_point_without_the_number():
    """The measurement itself runs twice elsewhere: in nbval's solved run of 08a (its check
    must say Well done) and in test_spark_scenarios' naive-sink tests (10 rows duplicated
    mid-sink, 0 after the commit); here the judging, on a table shaped as it measures."""
    right = solution_prediction()
    assert set(right) == set(exercise_points())
    measured = pd.DataFrame([{"crash_at": p, "duplicated": n, "lost": 0, "replayed_batches": []}
                             for p, n in right.items()])
    assert judge(right, measured).passed
    wrong = judge({**right, "spark-mid-sink": 20}, measured)
    assert not wrong.passed and "spark-mid-sink" in wrong.message
    assert str(right["spark-mid-sink"]) not in wrong.message


def test_unanswered_unknown_and_bad_answers_get_a_hint_without_running():
    unanswered = {p: None for p in exercise_points()}
    verdict = check_naive_duplicates(unanswered, "127.0.0.1:1")
    assert not verdict.passed and "fill in" in verdict.message
    verdict = check_naive_duplicates({"spark-after-lunch": 3}, "127.0.0.1:1")
    assert not verdict.passed and "spark-after-lunch" in verdict.message
    verdict = check_naive_duplicates({p: -1 for p in exercise_points()}, "127.0.0.1:1")
    assert not verdict.passed and "whole number" in verdict.message
    assert "must be a dict" in check_naive_duplicates([10, 0], "127.0.0.1:1").message


@pytest.mark.spark
def test_transactional_sink_restarted_from_the_checkpoint_skips_the_replay(bootstrap, tmp_path):
    """The notebook's hooks: resume="checkpoint", on_event, watch and spare=False."""
    events, watched = [], []

    @contextmanager
    def watch(names):
        watched.append(names)
        yield

    exp = experiments.run("spark-transactional", cluster=bootstrap,
                          guarantee="exactly_once",
                          crash_at="spark-after-sink-before-commit",
                          records=60, workdir=tmp_path, resume="checkpoint",
                          on_event=events.append, watch=watch, spare=False)
    assert watched == [{"input": exp.job.topic}]
    assert {e["attempt"] for e in events} == {1, 2}
    assert [e["event"] for e in events if e["attempt"] == 1][-1] == "crashed"
    # both attempts used the one checkpoint, so Spark replayed batch 1 into the sink ...
    assert {a.checkpoint_dir for a in exp.run.attempts} == {exp.job.checkpoint}
    replay = exp.run.timeline.query("replay")
    assert list(replay["batch_id"]) == [1]
    # ... and the optimistic offset check skipped it: nothing written, nothing duplicated
    assert replay["skipped"].iloc[0].startswith(exp.job.topic)
    assert (exp.report.lost, exp.report.duplicated) == (0, 0) and exp.report.exactly_once
    assert runner._spare is None  # spare=False: no Spark worker left starting for a next crash


@pytest.mark.spark
def test_the_unprefixed_option_check_measures_the_aborted_records_and_hints_without_the_number(bootstrap):
    right = solution_scope("08b_spark_kafka_in_and_out")["my_aborted_visible"]
    verdict = check_unprefixed_option(right, bootstrap)
    # the run measured the aborted records in the table: without the kafka. prefix Spark
    # ignored the option (the solution's number is the measured one, not a constant here)
    assert verdict.passed, verdict.message
    assert f"found {right} records of aborted transactions" in verdict.message
    wrong = check_unprefixed_option(0, bootstrap)
    assert not wrong.passed and str(right) not in wrong.message, wrong.message


def test_the_unprefixed_option_check_hints_without_running_spark():
    assert "fill in my_aborted_visible" in check_unprefixed_option(None, "127.0.0.1:1").message
    for bad in (-1, 2.5, "20", True):
        assert "whole number" in check_unprefixed_option(bad, "127.0.0.1:1").message


def test_08c_check_hints_without_the_answer_and_refuses_bad_input_without_running():
    """The measured run is nbval's solved run of 08c (its check must say Well done); here the
    paths that must not give the answer away or start Spark."""
    from labkit.exercises import spark_delta

    right = solution_scope("08c_spark_delta_idempotent_writes")["my_prediction"]
    wrong = spark_delta.judge({"commits": 4, "duplicated": 10}, right)
    assert not wrong.passed and "commits and duplicated" in wrong.message
    assert str(right["commits"]) not in wrong.message
    assert spark_delta.judge(right, right).passed
    check = spark_delta.check_append_mid_sink
    assert "replace each None" in check({"commits": None, "duplicated": 0}, "127.0.0.1:1").message
    assert "must be" in check({"commits": 3}, "127.0.0.1:1").message
    assert "whole number" in check({"commits": 3, "duplicated": -1}, "127.0.0.1:1").message
