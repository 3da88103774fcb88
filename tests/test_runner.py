"""The crash-point runner: a real child process, SIGKILLed at the armed point, restarted
from its committed state until it finishes."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from labkit.faults.crashpoints import UnknownCrashPoint, crash_point
from labkit.faults.runner import WorkerFailed, run_worker


def counting_worker(state: str, steps: int) -> None:
    """Does ``steps`` steps; the number done is its committed state (a file)."""
    path = Path(state)
    done = int(path.read_text()) if path.exists() else 0
    for i in range(done, steps):
        with open(f"{state}.log", "a") as log:
            log.write(f"{os.getpid()} step {i + 1}\n")
        crash_point("after-process-before-commit")
        path.write_text(str(i + 1))  # the commit


def failing_worker() -> None:
    raise RuntimeError("the worker's own bug")


def test_crash_at_the_nth_hit_then_restart_resumes_from_committed_state(tmp_path):
    state = str(tmp_path / "state")
    result = run_worker(counting_worker, {"state": state, "steps": 5},
                        crash_at="after-process-before-commit", hit=3)
    assert result.crashed is True
    assert result.attempts == 2
    assert result.exit_codes == [-9, 0]
    assert len(result.durations_s) == 2 and result.restart_s == result.durations_s[1]
    assert Path(state).read_text() == "5"
    lines = Path(f"{state}.log").read_text().splitlines()
    pids = [line.split()[0] for line in lines]
    # Steps 1-2 committed, step 3 done but killed before its commit, so done again.
    assert [line.split(" ", 1)[1] for line in lines] == [
        "step 1", "step 2", "step 3", "step 3", "step 4", "step 5"]
    assert pids[0] == pids[2] != pids[3] == pids[5]  # two processes, the 2nd a restart
    assert str(os.getpid()) not in pids  # never in the test's own process


def test_without_a_crash_point_it_runs_once(tmp_path):
    result = run_worker(counting_worker, {"state": str(tmp_path / "s"), "steps": 3})
    assert (result.crashed, result.attempts, result.exit_codes) == (False, 1, [0])
    assert result.restart_s is None


def test_a_point_never_reached_does_not_crash(tmp_path):
    result = run_worker(counting_worker, {"state": str(tmp_path / "s"), "steps": 3},
                        crash_at="after-process-before-commit", hit=10)
    assert (result.crashed, result.attempts) == (False, 1)


def test_unknown_crash_point_lists_the_valid_ones(tmp_path):
    with pytest.raises(UnknownCrashPoint) as err:
        run_worker(counting_worker, {"state": str(tmp_path / "s"), "steps": 1}, crash_at="nowhere")
    assert "after-process-before-commit" in str(err.value) and "nowhere" in str(err.value)


def test_a_failing_worker_reports_its_error():
    with pytest.raises(WorkerFailed) as err:
        run_worker(failing_worker, {})
    assert "the worker's own bug" in str(err.value)
    assert "exited with code 1" in str(err.value)


def test_worker_must_be_importable_and_arguments_plain_data(tmp_path):
    with pytest.raises(ValueError, match="module-level function"):
        run_worker(lambda: None, {})
    with pytest.raises(ValueError, match="JSON"):
        run_worker(counting_worker, {"state": tmp_path, "steps": 1})
