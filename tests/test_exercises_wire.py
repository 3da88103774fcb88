"""09b · the exercise check runs Kafka's Java copier and reads its markers' epochs (transaction
version 2: one bump per commit), on the real broker."""
from __future__ import annotations

from labkit.exercises.wire import check_last_marker_epoch, judge, last_marker_epoch
from tests.solution_code import solution_scope


def test_the_java_copiers_last_marker_epoch_is_the_documented_answer(bootstrap):
    measured = last_marker_epoch(bootstrap)
    assert measured == solution_scope("09b_on_the_wire")["my_epoch"] == 3
    assert judge(3, measured).passed
    wrong = judge(0, measured)  # the classic protocol's answer
    assert not wrong.passed and "3" not in wrong.message  # a hint, not the answer


def test_unanswered_and_bad_answers_get_a_hint_without_running():
    assert "fill in my_epoch" in check_last_marker_epoch("127.0.0.1:1", None).message
    assert "whole number" in check_last_marker_epoch("127.0.0.1:1", "3").message
