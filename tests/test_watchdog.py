"""The experiment watchdog: on its own (no broker), a body that stops making progress ends
with ExperimentStalled naming its last step and what it waited for, after on_stall ran; a
body that finishes or fails is handed back as it is. Around every experiment: a real worker
that hangs is stopped (below), and tests/test_coordinator_failover.py stalls a loop on
purpose under broker kills."""
from __future__ import annotations

import threading
import time

import pytest

from labkit.faults.watchdog import ExperimentStalled, Watchdog


def test_a_body_without_progress_is_stopped_with_its_last_step_named():
    release = threading.Event()
    stopped: list[str] = []
    watchdog = Watchdog("demo", stall_s=0.5)
    watchdog.progress("10 inputs written", "batch 1: consume, produce")

    def body() -> None:
        watchdog.progress("batch 1: committed", "batch 2: send_offsets_to_transaction()")
        release.wait(30)  # stuck, as a call blocked inside the client would be

    started = time.monotonic()
    try:
        with pytest.raises(ExperimentStalled) as stalled:
            watchdog.run(body, on_stall=lambda: stopped.append("brokers"))
    finally:
        release.set()
    assert 0.5 <= time.monotonic() - started < 5
    assert stopped == ["brokers"]
    assert stalled.value.last_step == "batch 1: committed"
    assert "waiting for batch 2: send_offsets_to_transaction()" in str(stalled.value)
    # where its code stood: the line it blocked on, the evidence a stall report needs
    assert "release.wait(30)" in stalled.value.stood_in, stalled.value.stood_in
    assert "in body" in str(stalled.value)


def test_a_body_that_keeps_making_progress_is_left_to_finish():
    watchdog = Watchdog("demo", stall_s=3)

    def body() -> int:
        for n in range(8):  # 8 s in all, longer than stall_s, never 3 s without progress
            time.sleep(1)  # (a 1 s sleep that a loaded machine stretches past 3 s: a stall)
            watchdog.progress(f"step {n}")
        return 42

    assert watchdog.run(body, on_stall=lambda: pytest.fail("stopped while progressing")) == 42


def test_a_body_that_fails_fails_as_it_is():
    with pytest.raises(ZeroDivisionError):
        Watchdog("demo", stall_s=5).run(lambda: 1 / 0, on_stall=lambda: None)
    with pytest.raises(ValueError, match="positive"):
        Watchdog("demo", stall_s=0)


HANGS = '''import time


def hangs_after_it_started(bootstrap, input_topic, group_id):
    time.sleep(600)  # never consumes: a loop stuck in a call, as far as anyone can see
'''


def test_every_experiment_runs_watched_a_hung_pipeline_is_stopped_and_named(bootstrap,
                                                                            tmp_path):
    """The watchdog is the experiment API's, not one experiment's: a learner's pipeline that
    hangs in a real worker process makes `experiments.run` stop after `stall_after`, with an
    error naming the last step it logged, and the worker it started is killed, not left."""
    import importlib.util

    import psutil

    from labkit import experiments

    (tmp_path / "hang.py").write_text(HANGS)
    spec = importlib.util.spec_from_file_location("hang", tmp_path / "hang.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    with pytest.raises(ExperimentStalled) as stalled:
        experiments.run("consume-transform-produce", cluster=bootstrap, guarantee="exactly_once",
                        records=20, pipeline=module.hangs_after_it_started, stall_after=6)
    took = time.monotonic() - started
    message = str(stalled.value)
    assert "consume-transform-produce made no progress for 6 s" in message, message
    assert "instance 0 started (attempt 1)" in message, message  # its last step, named
    assert "instance 0 to process its input" in message, message  # what it waited for
    assert took < 60, f"the watchdog took {took:.0f} s"

    def left() -> list:
        return [p for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]

    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() == [], [p.cmdline() for p in left()]



def test_a_stopped_runs_body_left_behind_starts_nothing_once_the_run_has_ended():
    """The body of a stalled run is left blocked (a daemon thread, in a copy of the run's
    context, as Watchdog.run starts it); the run ends and its listener goes. Should the body
    wake later, its restart must still see the stop: in a fresh clone's suite a worker
    restarted that way outlived its run."""
    import contextvars

    from labkit import progress

    woke, outcome = threading.Event(), {}

    def body() -> None:
        woke.wait(30)
        try:
            progress.check()  # what a restart asks first
            outcome["check"] = "passed"
        except progress.Stopped:
            outcome["check"] = "stopped"

    with progress.listening(lambda *_: None) as listening:
        thread = threading.Thread(target=contextvars.copy_context().run, args=(body,))
        thread.start()
        listening.stop()
    woke.set()  # the run is over, its listener gone; now the body goes on
    thread.join(10)
    assert outcome == {"check": "stopped"}
    progress.check()  # the next run, from this thread, is not stopped by it
