"""The crash-point runner: a real child process, SIGKILLed at the armed point, restarted
from its committed state until it finishes."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil
import pytest

from labkit.faults.crashpoints import UnknownCrashPoint, crash_point
from labkit.faults.pool import WorkerPool
from labkit.faults.runner import WorkerFailed, run_worker, run_workers, run_zombie


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


def stalling_worker(state: str) -> None:
    """Writes 'before', stalls at its point if armed to, then writes 'after'."""
    with open(state, "a") as out:
        out.write(f"{os.getpid()} before\n")
    crash_point("in-transaction-before-commit")
    with open(state, "a") as out:
        out.write(f"{os.getpid()} after\n")


def test_several_instances_run_at_once_and_only_the_chosen_one_crashes(tmp_path):
    states = [str(tmp_path / f"s{i}") for i in range(3)]
    result = run_workers(counting_worker, [{"state": s, "steps": 3} for s in states],
                         crash_at="after-process-before-commit", hit=2, crash_instance=1)
    assert result.crashed and result.attempts == 4
    assert sorted(result.exit_codes) == [-9, 0, 0, 0]
    assert [Path(s).read_text() for s in states] == ["3", "3", "3"]
    # only instance 1 repeated its step 2 (done, killed before its commit, done again)
    logs = [Path(f"{s}.log").read_text().count("step 2") for s in states]
    assert logs == [1, 2, 1]


def test_the_zombie_is_frozen_while_its_successor_runs_then_woken(tmp_path):
    log = tmp_path / "log"
    result = run_zombie(stalling_worker, {"state": str(log)}, {"state": str(log)},
                        stall_at="in-transaction-before-commit")
    assert (result.zombie_exit, result.successor_exit) == (0, 0)
    lines = log.read_text().splitlines()
    zombie, successor = lines[0].split()[0], lines[1].split()[0]
    # the zombie stopped between its two lines; the successor ran whole in between
    assert [line.split()[1] for line in lines] == ["before", "before", "after", "after"]
    assert [line.split()[0] for line in lines] == [zombie, successor, successor, zombie]


def test_a_zombie_that_never_reaches_its_stall_point_is_reported_and_reaped(tmp_path):
    with pytest.raises(WorkerFailed, match="never reached its stall point"):
        run_zombie(counting_worker, {"state": str(tmp_path / "s"), "steps": 1},
                   {"state": str(tmp_path / "t"), "steps": 1}, stall_at="mid-batch")


def test_a_failing_instance_stops_the_others(tmp_path):
    # one instance fails at once; the other would run for a minute: it must be killed
    with pytest.raises(WorkerFailed, match="instance 0 attempt 1 exited with code 1"):
        run_workers("tests.test_runner:failing_or_sleeping", [{"fail": True}, {"fail": False}])
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "failing_or_sleeping" in " ".join(p.info["cmdline"] or [])]


def failing_or_sleeping(fail: bool) -> None:
    if fail:
        time.sleep(0.5)
        raise RuntimeError("instance failed")
    time.sleep(60)


def sleeping_worker(seconds: float) -> None:
    time.sleep(seconds)


def test_a_start_is_told_outside_the_pools_lock_so_a_fault_may_call_back_from_another_thread():
    """A fault an event fires may call into the pool from a thread of its own (a member that
    joins when the input's thread reports an event, while the pool restarts an instance):
    a start told while the pool held its lock left the two threads waiting on each other."""
    added: list[int] = []
    waited: list[bool] = []

    def on_event(kind: str, fields: dict) -> None:
        if kind == "instance-started" and fields["instance"] == 0:
            other = threading.Thread(target=lambda: added.append(pool.add({"seconds": 0.1})))
            other.start()
            other.join(3)  # it must get the pool's lock now, not when the event returns
            waited.append(other.is_alive())

    pool = WorkerPool("tests.test_runner:sleeping_worker", [{"seconds": 0.5}],
                      on_event=on_event, timeout_s=60)
    result = pool.run()
    assert waited == [False] and added == [1] and result.exit_codes == [0, 0]
