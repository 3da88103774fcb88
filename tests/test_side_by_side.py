"""The capstone's runs side by side (labkit.exercises.side_by_side): a run no longer wanted
leaves nothing running, and a run that fails says why with its log."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from labkit.exercises import side_by_side
from labkit.exercises.side_by_side import Apart, JudgedRunError
from labkit.pipelines import production_loop


def _group(pgid: int) -> list[psutil.Process]:
    """The processes of group ``pgid`` still running (an exited one its parent has not reaped
    yet, a zombie, runs nothing: once the run's process is gone, its orphans' parent is the
    machine's init, which reaps when it will)."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def test_a_cancelled_run_stops_its_instances(bootstrap):
    run = Apart(production_loop.fee_service, bootstrap, phase="schedule", instances=3,
                records=600, seed=10)
    deadline = time.monotonic() + 60
    while len(_group(run.process.pid)) < 5 and time.monotonic() < deadline:
        time.sleep(0.2)  # the run, the server it forks its instances from, 3 instances
    assert len(_group(run.process.pid)) >= 5, "the run's instances never started"
    run.cancel()
    assert run.done()
    assert _group(run.process.pid) == []  # the worker and every instance it started


def test_a_run_that_fails_says_why_from_its_log(bootstrap):
    run = Apart(production_loop.fee_service, bootstrap, phase="schedule", instances=0)
    with pytest.raises(JudgedRunError, match="instances"):
        run.outcome()


def test_runs_beyond_the_machines_slots_wait_for_one(bootstrap, monkeypatch, tmp_path):
    """With one slot, a second run waits until the first one's process has ended."""
    monkeypatch.setenv("LABKIT_JUDGED_RUNS_AT_ONCE", "1")
    monkeypatch.setattr(side_by_side, "SLOTS_DIR", tmp_path)  # not the other tests' slots
    first = Apart(production_loop.fee_service, bootstrap, phase="schedule", instances=0)
    second = Apart(production_loop.fee_service, bootstrap, phase="schedule", instances=0)
    assert first.process is not None and second.process is None
    with pytest.raises(JudgedRunError):
        first.outcome()
    with pytest.raises(JudgedRunError):
        second.outcome()  # started once the first had ended, and ended the same way
    assert second.process is not None


def test_a_bad_number_of_slots_says_what_to_write(monkeypatch):
    monkeypatch.setenv("LABKIT_JUDGED_RUNS_AT_ONCE", "many")
    with pytest.raises(ValueError, match="a whole number"):
        Apart(production_loop.fee_service, None, phase="schedule")


OWNER = """
import sys, time
from labkit.exercises.side_by_side import Apart
from labkit.pipelines import production_loop
run = Apart(production_loop.fee_service, sys.argv[1], phase="schedule", instances=3,
            records=600, seed=11)
print(run.process.pid, flush=True)
time.sleep(600)
"""


def _started_by(mark: str) -> list[psutil.Process]:
    """The processes running (not zombies) whose environment carries ``mark``: what one
    owner started, and not what other tests, running at the same time, did."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("LABKIT_TEST_OWNER") == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_no_judged_run_outlives_its_kernel_killed(bootstrap):
    """The kernel SIGKILLed mid-run (no atexit, no clean-up of its own): the judge server it
    started, the run forked from it and the run's instances all end with it."""
    mark = uuid.uuid4().hex
    owner = subprocess.Popen([sys.executable, "-c", OWNER, bootstrap], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "LABKIT_TEST_OWNER": mark})
    try:
        run_pid = int(owner.stdout.readline())
        deadline = time.monotonic() + 60
        while len(_group(run_pid)) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)  # the run, the server it forks its instances from, 3 instances
        assert len(_group(run_pid)) >= 5, "the run's instances never started"
        assert len(_started_by(mark)) >= 7  # and the owner, its judge server
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 15
    left = None
    while time.monotonic() < deadline:
        left = _started_by(mark)
        if not left:
            break
        time.sleep(0.2)
    assert not left, f"still running after their kernel was killed: {left}"
