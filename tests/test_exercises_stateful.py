"""07 · stateful exactly-once: the exercise check and the restore-isolation knob, on real runs;
07b · what a crash costs Kafka Streams: its exercise check."""
from __future__ import annotations

from labkit import experiments
from labkit.experiments import scenarios
from labkit.exercises import restore
from labkit.exercises.restore import check_short_keys
from labkit.exercises.stateful import POINTS, check_store_on_disk
from tests.notebook_cells import as_cell, edited, read
from tests.solution_code import solution_code, solution_scope

SOLUTION = solution_code("07_stateful_exactly_once")
# the solution's lines that empty the file before filling it from the changelog
EMPTYING = '    store.execute("DELETE FROM counts")\n'


def exercise_source() -> str:
    """The exercise cell's code as shipped: count_on_disk trusting its file."""
    return next(c.source for c in read("07_stateful_exactly_once").cells
                if c.cell_type == "code" and c.source.startswith("# EXERCISE"))


def test_the_documented_solution_passes_on_real_runs(bootstrap):
    verdict = check_store_on_disk(as_cell(SOLUTION, "count_on_disk"), bootstrap)
    assert verdict.passed, verdict.message


def test_a_store_filled_from_the_changelog_but_not_emptied_gets_the_over_count(bootstrap):
    """The committed counts written over the file's, without emptying it first: an account
    first seen in the aborted batch keeps its count from that batch."""
    not_emptied = edited(edited(SOLUTION, EMPTYING, ""), "INSERT INTO counts", "INSERT OR REPLACE INTO counts")
    not_emptied = as_cell(not_emptied, "count_on_disk")
    verdict = check_store_on_disk(not_emptied, bootstrap)
    assert not verdict.passed
    assert "too high" in verdict.message and POINTS[0] in verdict.message
    assert "DELETE" not in verdict.message and "read_committed" not in verdict.message


def test_the_shipped_exercise_is_refused_with_a_hint_not_the_answer(bootstrap):
    """The notebook's stored output shows this verdict; here it is measured again."""
    verdict = check_store_on_disk(as_cell(exercise_source(), "count_on_disk"), bootstrap)
    assert not verdict.passed and "10 payments too high" in verdict.message
    for answer in ("DELETE", "restore", "read_committed", "wipe"):
        assert answer not in verdict.message


def test_what_is_not_a_function_or_lost_its_crash_points_is_refused_before_running():
    assert "your function itself" in check_store_on_disk(None, "127.0.0.1:1").message
    no_points = as_cell(SOLUTION.replace('crash_point("after-commit")', "pass"), "count_on_disk")
    verdict = check_store_on_disk(no_points, "127.0.0.1:1")
    assert not verdict.passed and "after-commit" in verdict.message


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
