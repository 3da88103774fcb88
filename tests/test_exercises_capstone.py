"""10 · capstone: the learner's service is what runs. The team's code as shipped fails the
audit with findings and hints; the documented solution is tried at every crash point it
passes and a lost ack (its passing run is the solved notebook's, test_exercise_solutions)."""
from __future__ import annotations

import re

import pandas as pd
import pytest

from labkit.exercises import capstone
from tests.notebook_cells import as_cell, edited, read
from tests.solution_code import exercise_indices, solution_code

NOTEBOOK = "10_capstone"


def team_cell() -> str:
    nb = read(NOTEBOOK)
    (index,) = exercise_indices(nb)
    return nb.cells[index].source


def team_service():
    return as_cell(team_cell(), "ledger_service")


def solution_service():
    return as_cell(solution_code(NOTEBOOK), "ledger_service")


def test_the_documented_solution_is_tried_at_every_crash_point_and_a_lost_ack():
    service = solution_service()
    capstone.validate(service, "read_committed")
    assert capstone.crash_points_in(service) == [
        "after-poll-before-process", "mid-batch", "after-produce-before-flush",
        "in-transaction-before-commit", "after-send-offsets-before-commit", "after-commit"]
    assert len(capstone.experiments(service)) == 7


def test_a_cell_with_the_fix_below_the_teams_code_is_judged_by_the_fix():
    """The solved notebook keeps the team's def and adds the fix under it: the last def runs,
    so only its crash points count (the team's after-process-before-commit is not in it)."""
    both = as_cell(team_cell() + "\n" + solution_code(NOTEBOOK), "ledger_service")
    assert "after-process-before-commit" not in capstone.crash_points_in(both)
    assert len(capstone.experiments(both)) == 7


def test_the_teams_code_fails_with_findings_and_hints(bootstrap):
    service = team_service()
    results = capstone.run_capstone(service, "read_uncommitted", bootstrap)
    assert (results["payments"] == capstone.PAYMENTS).all()
    crashes = results[results["experiment"].str.startswith("crash")]
    assert len(crashes) == 5 and (crashes["charged_twice"] > 0).all()  # + the off-by-one
    # the idempotent producer does handle the lost ack
    assert results.set_index("experiment").loc["lost produce ack", "exactly_once"]
    verdict = capstone.check_capstone(service, "read_uncommitted", results)
    assert not verdict.passed
    assert "charged twice" in verdict.message and "commit together" in verdict.message
    assert "next one to read" in verdict.message  # the off-by-one's hint


def test_a_transactional_service_read_uncommitted_gets_the_aborted_hint(bootstrap):
    """The hint for aborted payments comes once the learner's code has transactions."""
    verdict = capstone.check_capstone(solution_service(), "read_uncommitted",
                                      capstone.run_capstone(solution_service(),
                                                            "read_uncommitted", bootstrap,
                                                            payments=40))
    assert not verdict.passed
    assert "aborted visible" in verdict.message and "ABORTED transactions" in verdict.message


OFFSETS_IN_THE_TRANSACTION = """            producer.send_offsets_to_transaction(
                [TopicPartition(last.topic(), last.partition(), last.offset() + 1)],
                consumer.consumer_group_metadata(), 60)
            crash_point("after-send-offsets-before-commit")
            producer.commit_transaction(60)
"""
OFFSETS_BY_THE_CONSUMER = """            consumer.commit(offsets=[TopicPartition(last.topic(), last.partition(),
                                                    last.offset() + 1)], asynchronous=False)
            crash_point("after-send-offsets-before-commit")
            producer.commit_transaction(60)
"""


def test_a_loop_that_commits_its_offsets_outside_the_transaction_gets_a_hint(bootstrap):
    """The documented solution with one change: the consumer commits the offsets itself,
    where the offsets were sent to the transaction. A crash before the transaction commits
    aborts the batch's output, and its offsets say it was done: lost."""
    service = as_cell(edited(solution_code(NOTEBOOK), OFFSETS_IN_THE_TRANSACTION,
                             OFFSETS_BY_THE_CONSUMER), "ledger_service")
    results = capstone.run_capstone(service, "read_committed", bootstrap, payments=40)
    by_point = results.set_index("experiment")
    assert by_point.loc["crash at after-send-offsets-before-commit", "lost"] > 0, results
    verdict = capstone.check_capstone(service, "read_committed", results, bootstrap)
    assert not verdict.passed and "payments were LOST" in verdict.message


def test_the_teams_loop_under_torture_is_not_exactly_once(bootstrap):
    """The torture that follows the named points kills the learner's own function at random
    moments: the team's loop (offsets committed off by one, after the write) writes a
    payment twice at its first restart, whichever moment the kill hits."""
    tortured = capstone.torture_service(team_service(), bootstrap)
    assert tortured.kills >= 1, tortured.summary()
    assert tortured.report.duplicated > 0 and tortured.verdict != "exactly once", \
        tortured.summary()


def test_a_table_claiming_success_is_measured_again(bootstrap):
    """The check never takes a table's word for it: a table that did not come from this code
    (here: one written by hand, every row exact) means a fresh measurement."""
    service = team_service()
    claimed = pd.DataFrame([{"experiment": f"crash at {point}", "payments": capstone.PAYMENTS,
                             "lost": 0, "charged_twice": 0, "reordered": 0,
                             "aborted_visible": 0, "exactly_once": True}
                            for point in capstone.crash_points_in(service)])
    verdict = capstone.check_capstone(service, "read_uncommitted", claimed, bootstrap)
    assert not verdict.passed and "charged twice" in verdict.message


@pytest.mark.parametrize("change, reads, message", [
    (None, "read_comitted", "choose one of"),
    (('                crash_point("mid-batch")\n', ""), "read_committed",
     "no longer calls crash_point() at ['mid-batch']"),
])
def test_bad_input_gets_a_message_that_says_what_to_change(change, reads, message):
    source = edited(team_cell(), *change) if change else team_cell()
    service = as_cell(source, "ledger_service")
    with pytest.raises(ValueError, match=re.escape(message)):
        capstone.validate(service, reads)
    verdict = capstone.check_capstone(service, reads)
    assert not verdict.passed and message in verdict.message
