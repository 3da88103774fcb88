"""09c · the exercise check runs the late write with the Java client and its first Produce
kept, and compares the learner's prediction with the broker's answer and a read_committed
read; a wrong answer gets a hint that does not name the right one."""
from __future__ import annotations

from labkit.exercises.late_write import check_late_produce, judge, measured
from tests.solution_code import solution_scope


def test_the_documented_answer_is_what_the_broker_does(bootstrap):
    run = measured(bootstrap)
    answer = solution_scope("09c_the_late_write")
    assert (run["answer"], run["visible"]) == (answer["my_answer"], answer["my_visible"]) \
        == ("INVALID_PRODUCER_EPOCH", ["t2"]), run
    assert run["carried_epoch"] < run["partition_epoch"], run
    assert judge(answer["my_answer"], answer["my_visible"], run).passed
    for wrong in (judge("accepted", ["t2"], run), judge("PRODUCER_FENCED", ["t2"], run),
                  judge("INVALID_PRODUCER_EPOCH", ["t1", "t2"], run)):
        assert not wrong.passed
        assert "INVALID_PRODUCER_EPOCH" not in wrong.message and "['t2']" not in wrong.message


def test_unanswered_and_bad_answers_get_a_hint_without_running():
    assert "fill in my_answer" in check_late_produce(None, ["t2"]).message
    assert "string" in check_late_produce(True, ["t2"]).message
    assert "list of record ids" in check_late_produce("accepted", "t2").message
    assert "list of record ids" in check_late_produce("accepted", ["t3"]).message
