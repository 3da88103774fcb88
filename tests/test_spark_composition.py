"""The parts the Spark experiments are composed of that need no Spark: a fault timed after an
event (the real-time kill, seconds after the first checkpoint), the query's crash point
refused where it cannot be armed, and what a run keeps (topics, directory) deleted by its
context: when it fails, and when a notebook's last cell cleans up."""
from __future__ import annotations

import time

import pytest

from labkit.checking import audit
from labkit.experiments.context import RunContext
from labkit.experiments.parts import Topic, Workload, in_thread
from labkit.experiments.registry import Experiment, perform
from labkit.faults.nemesis import Event, Fault, Nemesis, after, on
from labkit.kafka import topics
from labkit.spark.clients import SparkQuery


class Noted(Fault):
    name = "noted"

    def __init__(self, trigger):
        self.trigger, self.at = trigger, None

    def invoke(self, run) -> None:
        self.at = time.monotonic()


def test_a_fault_after_an_event_fires_that_long_after_it_and_not_before():
    fault = Noted(after(0.3, since=on("checkpoint")))
    assert str(fault.trigger) == "0.3 s after the first checkpoint"
    nemesis = Nemesis(fault)
    with nemesis.active(run=None):
        time.sleep(0.4)
        assert fault.at is None  # no checkpoint yet: the clock has not started
        nemesis.notify(None, Event("batch-end", {"batch": 0}))
        reported = time.monotonic()
        nemesis.notify(None, Event("checkpoint", {"batch": 0}))
        time.sleep(0.6)
    assert fault.at is not None and 0.3 <= fault.at - reported < 0.5
    with pytest.raises(ValueError, match="before the first checkpoint"):
        after(-1, since=on("checkpoint"))


def test_a_spark_query_is_crashed_in_its_first_attempt_by_a_kill_only():
    query = SparkQuery(job=lambda run, workdir: None)
    query.arm(0, "spark-mid-sink", 2)
    assert (query.crash_at, query.hit) == ("spark-mid-sink", 2)
    with pytest.raises(ValueError, match="first attempt"):
        query.arm(1, "spark-mid-sink")
    with pytest.raises(ValueError, match="cannot freeze"):
        query.arm(0, "spark-mid-sink", stall=True)


def _run(bootstrap: str, clients, **options) -> tuple[RunContext, Experiment]:
    """A run of one topic that keeps it, and its directory, unless it fails."""
    experiment = Experiment("kept", "a run that keeps its topics and directory",
                            workload=lambda o: Workload("kept", (Topic("input"),)),
                            clients=in_thread(clients),
                            checkers=lambda o: [lambda run: audit.check("kept", "at_least_once",
                                                                        [], [])])
    return RunContext("kept", options, bootstrap=bootstrap), experiment


def test_a_failed_run_keeps_no_topics_even_when_asked_to(bootstrap):
    def fail(run):
        (run.workdir / "log").write_text("what the clients wrote")
        raise RuntimeError("the clients failed")

    run, experiment = _run(bootstrap, fail, keep_topics=True, keep_workdir=True)
    with pytest.raises(RuntimeError, match="the clients failed"):
        perform(experiment, run)
    assert run.topics["input"] not in topics.listing(bootstrap)
    assert (run.workdir / "log").exists()  # its directory is kept: a failure's logs


def test_what_a_run_kept_goes_when_its_record_is_cleaned_up(bootstrap):
    def write(run):
        (run.workdir / "table").write_text("rows")

    run, experiment = _run(bootstrap, write, keep_topics=True, keep_workdir=True)
    record = perform(experiment, run)
    assert record.topics["input"] in topics.listing(bootstrap)
    assert (run.workdir / "table").exists()
    record.cleanup()
    assert record.topics["input"] not in topics.listing(bootstrap)
    assert not run.workdir.exists()
    record.cleanup()  # twice: nothing left to delete, no error

