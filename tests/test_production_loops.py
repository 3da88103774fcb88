"""The loops the lab teaches as right hold as production runs them (issue 40): notebook 05's
general loop (its cell, with the rewind of 05's solution) and the capstone's documented
solution, each run by the judge as three instances of one group over three partitions under
the whole seeded schedule of production's faults (kills at random moments, a member joining
and one leaving, a zombie, refused produce and offsets, a successor fencing an instance):
exact, and nothing else found."""
from __future__ import annotations

import pytest

from labkit import experiments
from tests.notebook_cells import as_cell, read
from tests.solution_code import solution_code

SEED = 3


def loop_05():
    """05's general_fee_service as its cell defines it, the exercise's rewind solved below
    it (the later def is the one the loop calls)."""
    cells = [c.source for c in read("05_consume_transform_produce").cells
             if c.cell_type == "code" and "def general_fee_service(" in c.source]
    assert len(cells) == 1, f"{len(cells)} cells define general_fee_service"
    return as_cell(cells[0] + "\n\n" + solution_code("05_consume_transform_produce"),
                   "general_fee_service")


def capstone_solution():
    return as_cell(solution_code("10_capstone"), "ledger_service")


@pytest.mark.parametrize("loop", [loop_05, capstone_solution], ids=["05", "capstone"])
def test_the_taught_loop_is_exact_under_the_whole_schedule(bootstrap, loop):
    run = experiments.run("judge", phase="schedule", partitions=3, instances=3, records=600,
                          seed=SEED, pipeline=loop(), cluster=bootstrap)
    assert run.report.exactly_once and not run.findings, run.summary()
    assert len(run.faults_fired) >= 4, run.summary()  # the schedule landed on the loop
