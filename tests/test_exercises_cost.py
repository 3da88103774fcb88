"""09 · the cost: the exercise check against the real broker."""
from __future__ import annotations

from labkit.exercises.cost import RECORDS, RECORDS_PER_TXN, check_offsets, measured_high_watermark
from tests.solution_code import solution_scope


def test_one_commit_marker_per_transaction_takes_an_offset(bootstrap):
    hw, transactions = measured_high_watermark(bootstrap, records=25, records_per_txn=10)
    assert transactions == 3 and hw == 25 + 3


def test_the_documented_solution_passes_and_the_records_alone_do_not(bootstrap):
    scope = solution_scope("09_cost")
    assert scope["my_high_watermark"] == RECORDS + RECORDS // RECORDS_PER_TXN
    verdict = check_offsets(bootstrap, scope["my_high_watermark"])
    assert verdict.passed, verdict.message
    wrong = check_offsets(bootstrap, RECORDS)
    assert not wrong.passed and "higher" in wrong.message
    assert str(scope["my_high_watermark"]) not in wrong.message  # a hint, not the answer


def test_unanswered_gets_a_hint_without_running():
    verdict = check_offsets("127.0.0.1:1", None)
    assert not verdict.passed and "fill in" in verdict.message
