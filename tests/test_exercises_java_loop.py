"""09d · the exercise check runs the judge on the Java loop without its transaction, crashed
between its flush and its commit, and compares the learner's prediction with the audit of
what Kafka's output holds; a wrong answer gets a hint that does not name the right one."""
from __future__ import annotations

from labkit.exercises.java_loop import check_without_transaction, judge, measured
from tests.solution_code import solution_scope


def test_the_documented_answer_is_what_the_judge_finds(bootstrap):
    run = measured(bootstrap)
    answer = solution_scope("09d_the_java_loop")
    assert run["crashed"], run
    assert (run["verdict"], run["lost"]) == (answer["my_verdict"], answer["my_lost"]), run
    assert run["duplicated"] > 0, run  # the flushed batch written again by the restart
    assert judge(answer["my_verdict"], answer["my_lost"], run).passed
    for wrong in (judge("exactly once", 0, run), judge("at most once", 0, run),
                  judge(answer["my_verdict"], 10, run)):
        assert not wrong.passed
        assert answer["my_verdict"] not in wrong.message, wrong.message


def test_unanswered_and_bad_answers_get_a_hint_without_running():
    assert "fill in my_verdict" in check_without_transaction(None, 0).message
    assert "must be one of" in check_without_transaction("twice", 0).message
    assert "whole number" in check_without_transaction("exactly once", -1).message
    assert "whole number" in check_without_transaction("exactly once", True).message
