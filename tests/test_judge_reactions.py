"""The judge fails each wrong reaction to production's faults (tests/wrong_loops.py) with its
finding, on the one kind of fault that shows it: an abort that rewinds one partition, an
abortable error swallowed, a fatal one retried, a transaction kept open across a rebalance.
(The reference loop under every kind of fault, 20 seeded schedules: benchmarks/judge_soak.py;
a loop written outside the lab under them: test_judge_outside_loops.py.)"""
from __future__ import annotations

import pytest

from tests.wrong_loops import WRONG, judged

UNDER_FAULTS = [name for name, w in WRONG.items() if w.phase != "point"]


@pytest.mark.parametrize("name", UNDER_FAULTS)
def test_a_wrong_reaction_fails_under_the_fault_that_shows_it(name, bootstrap):
    run = judged(name, bootstrap)
    assert run.faults_fired, run.summary()
    # what each instance raised, and where: a wrong loop that died instead of running on
    raised = [e for e in run.history if e["kind"] == "raised"]
    assert WRONG[name].shown_in(run), (name, run.summary(), raised)
    if WRONG[name].finding == "abortable-raised":  # what it raised, with Kafka's class of it
        assert run.errors and {e["class"] for e in run.errors} == {"abortable"}, run.errors
