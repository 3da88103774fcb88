"""The capstone's runs side by side (labkit.exercises.side_by_side): a run no longer wanted
leaves nothing running, and a run that fails says why with its log."""
from __future__ import annotations

import os
import time

import psutil
import pytest

from labkit.exercises.side_by_side import Apart, JudgedRunError
from labkit.pipelines import production_loop


def _group(pgid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def test_a_cancelled_run_stops_its_instances(bootstrap):
    run = Apart(production_loop.fee_service, bootstrap, phase="schedule", instances=3,
                records=600, seed=10)
    deadline = time.monotonic() + 60
    while len(_group(run.process.pid)) < 4 and time.monotonic() < deadline:  # 3 instances
        time.sleep(0.2)
    assert len(_group(run.process.pid)) >= 4, "the run's instances never started"
    run.cancel()
    assert run.done()
    assert _group(run.process.pid) == []  # the worker and every instance it started


def test_a_run_that_fails_says_why_from_its_log(bootstrap):
    run = Apart(production_loop.fee_service, bootstrap, phase="schedule", instances=0)
    with pytest.raises(JudgedRunError, match="instances"):
        run.outcome()
