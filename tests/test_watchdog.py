"""The experiment watchdog on its own (no broker): a body that stops making progress ends
with ExperimentStalled naming its last step and what it waited for, after on_stall ran; a
body that finishes or fails is handed back as it is. The real run under it:
tests/test_coordinator_failover.py (a loop stalled on purpose, its brokers stopped)."""
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
