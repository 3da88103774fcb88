"""Workers as an experiment runs them (``labkit.experiments.parts.Workers``: a pool of real
child processes, ``labkit.faults.pool``) under the nemesis's process faults, through the
registry's phases: SIGKILLed at the armed point and restarted from its committed state until
it finishes, a failure reported, a zombie frozen while its successor runs."""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest

from labkit.faults.crashpoints import UnknownCrashPoint, crash_point
from labkit.faults.nemesis import Fault, Nemesis, on
from labkit.faults.pool import WorkerFailed, WorkerPool
from labkit.faults.process_faults import CrashAt, Frozen, Join, StallAt, Thaw

if TYPE_CHECKING:
    from labkit.checking.record import RunRecord
    from labkit.experiments.context import RunContext


def supervised(worker: Callable | str, members: list[dict], *faults: Fault,
               facts: Callable[[RunContext], dict] | None = None) -> RunRecord:
    """``members`` instances of ``worker`` as an experiment's clients under ``faults``, run
    by the registry's phases as every experiment is; its record (``record.run``: the pool's
    RunResult, ``record.history``: its starts and exits)."""
    # imported here, not with the module: every worker process imports this module for its
    # function, and the registry's imports (the audit's pandas) cost each start most of a second
    from labkit.checking import audit
    from labkit.experiments.context import RunContext
    from labkit.experiments.parts import Workers, Workload
    from labkit.experiments.registry import Experiment, perform

    experiment = Experiment(
        "runner", "instances of a worker under process faults",
        workload=lambda o: Workload("runner"),
        clients=lambda run: Workers(worker, members, label="runner"),
        nemesis=lambda o: Nemesis(*faults),
        # the registry asks for one audit: these workers keep their state in files, which
        # each test reads itself
        checkers=lambda o: [lambda run: audit.check("runner", "at_least_once", [], [])],
        facts=facts)
    return perform(experiment, RunContext("runner", {}))


# Each worker takes the run's bootstrap (every instance of an experiment gets it) and
# ignores it: its state is a file.

def counting_worker(state: str, steps: int, bootstrap: str = "") -> None:
    """Does ``steps`` steps; the number done is its committed state (a file)."""
    path = Path(state)
    done = int(path.read_text()) if path.exists() else 0
    for i in range(done, steps):
        with open(f"{state}.log", "a") as log:
            log.write(f"{os.getpid()} step {i + 1}\n")
        crash_point("after-process-before-commit")
        path.write_text(str(i + 1))  # the commit


def failing_worker(bootstrap: str = "") -> None:
    raise RuntimeError("the worker's own bug")


def test_crash_at_the_nth_hit_then_restart_resumes_from_committed_state(tmp_path):
    state = str(tmp_path / "state")
    record = supervised(counting_worker, [{"state": state, "steps": 5}],
                        CrashAt("after-process-before-commit", hit=3, instance=0))
    result = record.run
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
    # the run's history names the same two processes, the killed one first
    started = [str(e["pid"]) for e in record.history if e["kind"] == "started"]
    assert started == [pids[0], pids[3]]


def test_without_a_crash_point_it_runs_once(tmp_path):
    result = supervised(counting_worker, [{"state": str(tmp_path / "s"), "steps": 3}]).run
    assert (result.crashed, result.attempts, result.exit_codes) == (False, 1, [0])
    assert result.restart_s is None


def test_a_point_never_reached_does_not_crash(tmp_path):
    result = supervised(counting_worker, [{"state": str(tmp_path / "s"), "steps": 3}],
                        CrashAt("after-process-before-commit", hit=10, instance=0)).run
    assert (result.crashed, result.attempts) == (False, 1)


def test_unknown_crash_point_lists_the_valid_ones(tmp_path):
    state = tmp_path / "s"
    with pytest.raises(UnknownCrashPoint) as err:
        supervised(counting_worker, [{"state": str(state), "steps": 1}],
                   CrashAt("nowhere", hit=1, instance=0))
    assert "after-process-before-commit" in str(err.value) and "nowhere" in str(err.value)
    assert not Path(f"{state}.log").exists()  # refused before any worker started


def test_a_failing_worker_reports_its_error():
    with pytest.raises(WorkerFailed) as err:
        supervised(failing_worker, [{}])
    assert "the worker's own bug" in str(err.value)
    assert "exited with code 1" in str(err.value)


def test_worker_must_be_importable_and_arguments_plain_data(tmp_path):
    with pytest.raises(ValueError, match="module-level function"):
        supervised(lambda: None, [{}])
    with pytest.raises(ValueError, match="JSON"):
        supervised(counting_worker, [{"state": tmp_path, "steps": 1}])


def stalling_worker(state: str, bootstrap: str = "") -> None:
    """Writes 'before', stalls at its point if armed to, then writes 'after'."""
    with open(state, "a") as out:
        out.write(f"{os.getpid()} before\n")
    crash_point("in-transaction-before-commit")
    with open(state, "a") as out:
        out.write(f"{os.getpid()} after\n")


def test_several_instances_run_at_once_and_only_the_chosen_one_crashes(tmp_path):
    states = [str(tmp_path / f"s{i}") for i in range(3)]
    result = supervised(counting_worker, [{"state": s, "steps": 3} for s in states],
                        CrashAt("after-process-before-commit", hit=2, instance=1)).run
    assert result.crashed and result.attempts == 4
    assert sorted(result.exit_codes) == [-9, 0, 0, 0]
    assert [Path(s).read_text() for s in states] == ["3", "3", "3"]
    # only instance 1 repeated its step 2 (done, killed before its commit, done again)
    logs = [Path(f"{s}.log").read_text().count("step 2") for s in states]
    assert logs == [1, 2, 1]


def zombie_faults(point: str, successor: dict) -> tuple[StallAt, Join, Thaw]:
    """The zombie-rebalance experiment's nemesis (labkit.experiments.zombie): instance 0
    freezes at ``point``, a successor starts once it is frozen, 0 is thawed once the
    successor has finished."""
    return (StallAt(point, hit=1, instance=0),
            Join(Frozen(0), successor, name="a successor takes over"),
            Thaw(0, on("instance-exited", instance=1, code=0)))


def stalled_s(run: RunContext) -> dict:
    """The zombie experiment's fact: how long instance 0 stayed frozen (WorkerFailed if it
    never got to its stall point)."""
    (stall,), (wake,) = run.nemesis.of(StallAt), run.nemesis.of(Thaw)
    return {"stalled_s": stall.stalled_s(wake.thawed_at)}


def test_the_zombie_is_frozen_while_its_successor_runs_then_woken(tmp_path):
    log = tmp_path / "log"
    record = supervised(stalling_worker, [{"state": str(log)}],
                        *zombie_faults("in-transaction-before-commit", {"state": str(log)}),
                        facts=stalled_s)
    exits = [(e["instance"], e["code"]) for e in record.history if e["kind"] == "exited"]
    assert exits == [("1", 0), ("0", 0)]  # both ended cleanly, the successor first
    assert record.stalled_s > 0
    lines = log.read_text().splitlines()
    zombie, successor = lines[0].split()[0], lines[1].split()[0]
    # the zombie stopped between its two lines; the successor ran whole in between
    assert [line.split()[1] for line in lines] == ["before", "before", "after", "after"]
    assert [line.split()[0] for line in lines] == [zombie, successor, successor, zombie]


def test_a_zombie_that_never_reaches_its_stall_point_is_reported_and_reaped(tmp_path):
    with pytest.raises(WorkerFailed, match="never reached its stall point"):
        supervised(counting_worker, [{"state": str(tmp_path / "s"), "steps": 1}],
                   *zombie_faults("mid-batch", {"state": str(tmp_path / "t"), "steps": 1}),
                   facts=stalled_s)
    assert not (tmp_path / "t").exists()  # no successor started: nothing froze
    # reaped: an exited child nobody waited for would still hold its process id
    (pid,) = {int(line.split()[0]) for line in (tmp_path / "s.log").read_text().splitlines()}
    assert not psutil.pid_exists(pid)


def test_a_failing_instance_stops_the_others(tmp_path):
    # one instance fails at once; the other would run for a minute: it must be killed
    with pytest.raises(WorkerFailed, match="instance 0 attempt 1 exited with code 1"):
        supervised("tests.test_runner:failing_or_sleeping", [{"fail": True}, {"fail": False}])
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "failing_or_sleeping" in " ".join(p.info["cmdline"] or [])]


def failing_or_sleeping(fail: bool, bootstrap: str = "") -> None:
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


def test_the_pool_tells_its_events_without_holding_its_lock(tmp_path):
    """The nemesis's thread holds its own lock while it asks the pool (``Frozen``: is
    instance 0 frozen?), and an event the pool tells takes that lock: told under the pool's
    lock, each would wait for the other (two zombie runs hung 600 s so under load). Each
    event's listener asks the pool from another thread, as the nemesis does, and must be
    answered: at the first start, at the restart after a crash, at a member that joins."""
    answered: list[tuple[str, bool]] = []

    def listener(kind: str, fields: dict) -> None:
        asker = threading.Thread(target=pool.frozen, args=(0,), daemon=True)
        asker.start()
        asker.join(5)
        answered.append((kind, not asker.is_alive()))
        if kind == "instance-exited" and fields["instance"] == 0 and fields["code"] == 0:
            pool.add({"state": str(tmp_path / "joined"), "steps": 1})

    pool = WorkerPool(counting_worker, [{"state": str(tmp_path / "s"), "steps": 2}],
                      on_event=listener)
    pool.arm(0, "after-process-before-commit", hit=1)
    pool.run()
    assert [kind for kind, _ in answered] == ["instance-started", "instance-exited"] * 3
    assert all(ok for _, ok in answered), answered
