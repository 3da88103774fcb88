"""10 · capstone: the learner's service is what runs, as the judge runs it (two instances of
one group over six partitions, two crash points a run, then the wire). The team's code as
shipped fails at the points with findings and hints, fast (no schedule runs); the documented
solution is the production loop, tried at every point it passes and under both group
protocols (its passing run is the solved notebook's, test_exercise_solutions; under the whole
schedule on three instances, test_production_loops)."""
from __future__ import annotations

import inspect
import re
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from labkit.cli import app
from labkit.exercises import capstone
from labkit.paths import lab_home
from labkit.experiments.judge import SETTINGS
from labkit.pipelines import learner
from tests.notebook_cells import as_cell, edited, read
from tests.solution_code import exercise_indices, solution_code

NOTEBOOK = "10_capstone"
SOLUTION_POINTS = ["after-poll-before-process", "mid-batch", "after-produce-before-flush",
                   "in-transaction-before-commit", "after-send-offsets-before-commit",
                   "after-commit"]


def team_cell() -> str:
    nb = read(NOTEBOOK)
    (index,) = exercise_indices(nb)
    return nb.cells[index].source


def team_service():
    return as_cell(team_cell(), "ledger_service")


def solution_service():
    return as_cell(solution_code(NOTEBOOK), "ledger_service")


def test_the_documented_solution_is_tried_at_every_crash_point_and_the_wire():
    service = solution_service()
    capstone.validate(service, "read_committed")
    assert capstone.crash_points_in(service) == SOLUTION_POINTS
    # two points a run (one per instance), then the wire, then a crash as it commits
    assert capstone.experiments(service) == [tuple(SOLUTION_POINTS[i:i + 2]) for i in (0, 2, 4)] \
        + [(), capstone.COMMITTING]
    assert capstone.schedules(service) == ["classic", "consumer"]


def test_the_teams_skeleton_takes_the_settings_the_judge_gives():
    """The team's function names instance_id and group_protocol: the judge gives each
    instance its own static member id, and the verdict runs both group protocols."""
    service = team_service()
    assert {"instance_id", "group_protocol"} <= set(inspect.signature(service).parameters)
    learner.check_parameters(service, set(SETTINGS))  # nothing the judge does not give
    assert capstone.schedules(service) == ["classic", "consumer"]


def test_a_cell_with_the_fix_below_the_teams_code_is_judged_by_the_fix():
    """The solved notebook keeps the team's def and adds the fix under it: the last def runs,
    so only its crash points count (the team's after-process-before-commit is not in it)."""
    both = as_cell(team_cell() + "\n" + solution_code(NOTEBOOK), "ledger_service")
    assert "after-process-before-commit" not in capstone.crash_points_in(both)
    assert len(capstone.experiments(both)) == 5


def test_the_teams_code_fails_fast_with_findings_and_hints(bootstrap):
    service = team_service()
    results = capstone.run_capstone(service, "read_uncommitted", bootstrap)
    assert (results["payments"] == capstone.PAYMENTS).all()
    by_run = results.set_index("experiment")
    # a crash between the write and the offsets' commit repeats what was written
    for run in ("crash at after-poll-before-process and mid-batch",
                "crash at after-produce-before-flush and after-process-before-commit"):
        assert by_run.loc[run, "charged_twice"] > 0, results
    # the idempotent producer does handle the lost ack (and the refused record was written)
    assert by_run.loc[capstone.label(()), "exactly_once"], results
    # killed as its offsets' commit is sent, its batch written: the batch again
    assert by_run.loc[capstone.label(capstone.COMMITTING), "charged_twice"] > 0, results
    started = time.monotonic()
    verdict = capstone.check_capstone(service, "read_uncommitted", results)
    assert time.monotonic() - started < 5  # no schedule runs: the points answered
    assert not verdict.passed
    assert "charged twice" in verdict.message and "commit together" in verdict.message
    found = capstone.found(results)
    assert list(found["charged twice"]) == ["yes", "yes", "", "", "yes"]
    # each run was stored in the lab's home: an instructor replays it without Kafka
    stored = results.attrs["stored"]
    assert len(stored) == len(results)
    assert all(Path(p).parent == lab_home() / "judged" / "lab" for p in stored), stored
    twice = results.index[results["charged_twice"] > 0][0]
    replayed = CliRunner().invoke(app, ["check", stored[twice]])
    assert replayed.exit_code == 0, replayed.output
    assert f"{results.loc[twice, 'charged_twice']} duplicated" in replayed.output, replayed.output


def test_a_transactional_service_read_uncommitted_gets_the_aborted_hint(bootstrap):
    """The hint for aborted payments comes once the learner's code has transactions."""
    verdict = capstone.check_capstone(solution_service(), "read_uncommitted",
                                      capstone.run_capstone(solution_service(),
                                                            "read_uncommitted", bootstrap,
                                                            payments=40))
    assert not verdict.passed
    assert "aborted visible" in verdict.message and "ABORTED transactions" in verdict.message


OFFSETS_IN_THE_TRANSACTION = """            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()),  # next to read, every partition
                consumer.consumer_group_metadata(), 30)
"""
OFFSETS_BY_THE_CONSUMER = """            consumer.commit(offsets=consumer.position(consumer.assignment()), asynchronous=False)
"""


def test_a_loop_that_commits_its_offsets_outside_the_transaction_gets_a_hint(bootstrap):
    """The documented solution with one change: the consumer commits the offsets itself,
    where the offsets were sent to the transaction. A crash before the transaction commits
    aborts the batch's output, and its offsets say it was done: lost."""
    service = as_cell(edited(solution_code(NOTEBOOK), OFFSETS_IN_THE_TRANSACTION,
                             OFFSETS_BY_THE_CONSUMER), "ledger_service")
    results = capstone.run_capstone(service, "read_committed", bootstrap, payments=40)
    by_run = results.set_index("experiment")
    assert by_run.loc["crash at after-send-offsets-before-commit and after-commit",
                      "lost"] > 0, results
    verdict = capstone.check_capstone(service, "read_committed", results, bootstrap)
    assert not verdict.passed and "payments were LOST" in verdict.message


def test_a_table_claiming_success_is_measured_again(bootstrap):
    """The check never takes a table's word for it: a table that did not come from this code
    (here: one written by hand, every row exact) means a fresh measurement."""
    service = team_service()
    claimed = pd.DataFrame([{"experiment": capstone.label(points), "payments": capstone.PAYMENTS,
                             "lost": 0, "charged_twice": 0, "aborted_visible": 0,
                             "exactly_once": True}
                            for points in capstone.experiments(service)])
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
