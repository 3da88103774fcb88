"""10 · capstone: the documented solution passes the audit, the starting settings fail it."""
from __future__ import annotations

import pytest

from labkit.exercises import capstone
from tests.solution_code import solution_scope


def solution_settings() -> dict:
    return solution_scope("10_capstone")["settings"]


def test_the_documented_solution_is_tried_at_every_crash_point_and_a_lost_ack():
    """Its run is the solved notebook's (test_exercise_solutions), whose verdict must say
    that all 7 experiments were audited exactly-once."""
    settings = solution_settings()
    capstone.validate(settings)
    assert len(capstone.experiments(settings)) == 7


def test_the_starting_settings_fail_with_findings_and_hints(bootstrap):
    settings = capstone.starting_settings()
    results = capstone.run_capstone(settings, bootstrap)
    assert (results["payments"] == capstone.PAYMENTS).all()
    crashes = results[results["experiment"].str.startswith("crash")]
    assert (crashes["charged_twice"] > 0).all()  # at_least_once + the off-by-one commit
    # the idempotent producer does handle the lost ack
    assert results.set_index("experiment").loc["lost produce ack", "exactly_once"]
    verdict = capstone.check_capstone(settings, results)
    assert not verdict.passed
    assert "charged twice" in verdict.message and "one transaction" in verdict.message


def test_an_edited_results_table_is_measured_again(bootstrap):
    """The check never takes a table's word for it: edited rows mean a fresh measurement."""
    settings = capstone.starting_settings()
    edited = capstone.run_capstone(settings, bootstrap, payments=40)
    edited["exactly_once"] = True
    assert not capstone.check_capstone(settings, edited, bootstrap).passed


@pytest.mark.parametrize("settings, message", [
    ({**capstone.STARTING_SETTINGS, "processing_guarantee": "exactly_twice"}, "choose one of"),
    ({"processing_guarantee": "exactly_once"}, "missing"),
    ({**capstone.STARTING_SETTINGS, "acks": "all"}, "unknown"),
])
def test_bad_settings_get_a_clear_message(settings, message):
    with pytest.raises(ValueError, match=message):
        capstone.validate(settings)
    verdict = capstone.check_capstone(settings)
    assert not verdict.passed and message in verdict.message
