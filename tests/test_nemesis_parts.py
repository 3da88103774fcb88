"""The nemesis's scheduling, without a broker: guards that hold a fault back until a later
event, field tests, the events a fault tells the story of, observations and waits, and what
each says on the timeline."""
from __future__ import annotations

import threading
import time

import pytest

from labkit.experiments.context import RunContext
from labkit.faults.nemesis import Fault, Nemesis, Observe, Until, WaitUntil, at_least, on


class Counted(Fault):
    """A fault that only counts its firings and says which batch fired it."""

    def __init__(self, trigger, when=None, repeat=False, says="batch {batch} broken"):
        self.trigger, self.when, self.repeat, self.says = trigger, when, repeat, says
        self.batches: list[int] = []

    def invoke(self, run) -> None:
        self.batches.append(self.fired_by.fields["batch"])
        run.fired(self, self.told(run, "broken"))


def run_with(*faults) -> RunContext:
    run = RunContext("nemesis-parts", {})
    run.nemesis = Nemesis(*faults)
    return run


def test_a_guard_holds_a_fault_back_until_a_later_event_and_the_client_hears_who_fired():
    window = {"open": False}
    held = Counted(on("batch-ended", batch=at_least(4)), when=lambda run: window["open"])
    every = Counted(on("batch-ended", batch=at_least(5)), repeat=True,
                    says=lambda told: f"{told['outcome']} at {told['batch']}")
    run = run_with(held, every)
    told = [run.event("batch-ended", batch=n, outcome="committed") for n in (3, 4)]
    window["open"] = True
    told += [run.event("batch-ended", batch=n, outcome="committed") for n in (5, 6)]
    assert told == [False, False, True, True]  # the client tells batches 3 and 4 itself
    assert held.batches == [5]  # armed at 4, its guard false; fired once at 5, not again
    assert every.batches == [5, 6]
    assert [s.what for s in run.steps] == ["batch 5 broken", "committed at 5", "committed at 6"]
    assert [f.what for f in run.fired_faults] == [s.what for s in run.steps]
    assert str(at_least(4)) == "4 or more"


def test_an_observation_joins_the_facts_and_a_wait_holds_the_reporting_thread():
    flag = threading.Event()
    wait = WaitUntil(on("before-commit", batch=2), Until(lambda run: flag.is_set(), "the flag", 5),
                     starting="batch {batch} slow", says="batch {batch} goes on")
    look = Observe(on("before-commit", batch=2), lambda run: {"seen": 7},
                   says="a reader sees {seen}")
    run = run_with(wait, look)
    threading.Timer(0.3, flag.set).start()
    began = time.monotonic()
    assert run.event("before-commit", batch=2)
    assert time.monotonic() - began >= 0.3 and wait.waited_s >= 0.3
    assert run.facts["seen"] == 7
    assert [s.what for s in run.steps] == ["batch 2 slow", "batch 2 goes on", "a reader sees 7"]
    assert [f.what for f in run.fired_faults] == ["batch 2 slow"]  # the observation is no fault


def test_a_wait_that_never_ends_names_what_it_waited_for():
    run = run_with(WaitUntil(on("x"), Until(lambda run: False, "the markers", 0.2)))
    with pytest.raises(TimeoutError, match="the markers"):
        run.event("x")
