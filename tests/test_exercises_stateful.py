"""07 · stateful exactly-once: the exercise check and the restore-isolation knob, on real runs."""
from __future__ import annotations

from labkit import experiments
from labkit.experiments import scenarios
from labkit.exercises.stateful import check_drift, exercise_points
from tests.solution_code import solution_scope


def solution_prediction() -> dict:
    return solution_scope("07_stateful_exactly_once")["my_prediction"]


def test_the_documented_solution_passes_and_a_wrong_one_does_not(bootstrap):
    right = solution_prediction()
    assert set(right) == set(exercise_points())
    verdict = check_drift(right, bootstrap)
    assert verdict.passed, verdict.message
    wrong = {**right, "after-commit": True}
    verdict = check_drift(wrong, bootstrap)
    assert not verdict.passed and "after-commit" in verdict.message


def test_strings_are_not_taken_for_booleans():
    """bool("False") is True: the check must refuse strings, not judge them as True."""
    quoted = {p: "False" for p in exercise_points()}
    verdict = check_drift(quoted, "127.0.0.1:1")
    assert not verdict.passed and "without quotes" in verdict.message


def test_unanswered_and_unknown_points_get_a_hint_without_running():
    unanswered = {p: None for p in exercise_points()}
    assert "fill in" in check_drift(unanswered, "127.0.0.1:1").message
    verdict = check_drift({"after-lunch": True}, "127.0.0.1:1")
    assert not verdict.passed and "after-lunch" in verdict.message


def test_restoring_the_changelog_read_uncommitted_brings_back_aborted_counts(bootstrap):
    kw = dict(crash_at="in-transaction-before-commit", records=40, cluster=bootstrap)
    right = experiments.run("running-count", guarantee="exactly_once", **kw).report
    wrong = experiments.run("running-count", guarantee="exactly_once", **kw,
                            options={"restore_isolation": "read_uncommitted"}).report
    assert right.exactly_once and right.state_matches
    assert wrong.duplicated == 0 and not wrong.state_matches
    over = sum(wrong.state_actual[k] - n for k, n in wrong.state_expected.items())
    assert over == scenarios.batch_size(40)  # the aborted batch is counted twice
