"""07 · stateful exactly-once: the exercise check and the restore-isolation knob, on real runs;
07b · what a crash costs Kafka Streams: its exercise check."""
from __future__ import annotations

from labkit import experiments
from labkit.experiments import scenarios
from labkit.exercises import restore
from labkit.exercises.restore import check_short_keys
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


# ---------------------------------------------------------------- 07b: the restore with short keys
def restore_solution() -> str:
    return solution_scope("07b_what_a_crash_costs_kafka_streams")["my_restore"]


def test_07b_the_documented_solution_passes_on_a_real_run(bootstrap):
    """The real Kafka Streams app, transactional stores on, the lab's short keys: the
    restarted instance restores every committed changelog record (docs/measurements.md)."""
    verdict = check_short_keys(bootstrap, restore_solution())
    assert verdict.passed, verdict.message
    assert "restored" in verdict.message and "memtable" in verdict.message


def test_07b_a_wrong_answer_gets_a_hint_and_not_the_answer():
    right = restore_solution()
    for wrong in (a for a in restore.ANSWERS if a != right):
        verdict = restore.judge(wrong, right, committed=561, restored=561)
        assert not verdict.passed
        assert "memtable" in verdict.message  # the question to ask...
        assert f'"{right}"' not in verdict.message and right not in verdict.message.split()
        assert "561" not in verdict.message  # ...and not the measured numbers
    assert restore.judge(right, right, committed=561, restored=561).passed


def test_07b_the_share_restored_is_read_from_the_counts():
    assert restore.restored_share(committed=1589, restored=1589) == "all"
    assert restore.restored_share(committed=1589, restored=480) == "part"
    assert restore.restored_share(committed=1589, restored=0) == "none"


def test_07b_unanswered_and_unknown_answers_get_a_hint_without_running():
    assert "fill in my_restore" in check_short_keys("127.0.0.1:1", None).message
    for odd in ("most", 1589, True):
        verdict = check_short_keys("127.0.0.1:1", odd)
        assert not verdict.passed and '"all", "part" or "none"' in verdict.message
