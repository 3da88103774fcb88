"""The `streams-restore` experiment on the real broker and real Kafka Streams 4.4.0: the lab's
running count under exactly_once_v2, SIGKILLed half way and restarted on the same state
directory, with and without transactional state stores (KIP-892).

Measured (docs/measurements.md, "Kafka Streams restore after an exactly-once crash
(KIP-892)"): the counts are exact in both modes, and in both the restarted instance restores
every committed changelog record (one per committed input record: the app has no record
cache). enable.transactional.statestores=true does not shorten the restore in 4.4.0 after a
SIGKILL; the restore tests below say so, and fail the day it does."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from labkit import experiments
from labkit.checking import audit
from labkit.experiments import streams_restore
from labkit.pipelines import data
from tests.test_harness import left_behind

RECORDS = 1000  # ~4 s of work at 4 ms a record: the kill lands half way, after ~10 s of JVM start
LABKIT = Path(sys.executable).with_name("labkit")


def streams_jvms() -> list[str]:
    """The running count's JVMs this test run started (they carry its LABKIT_HOME)."""
    home = os.environ.get("LABKIT_HOME")
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(p.info["cmdline"] or [])
            if "StreamsRunningCount.java" in cmdline and p.environ().get("LABKIT_HOME") == home:
                found.append(cmdline[:120])
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(autouse=True)
def no_jvm_left_behind():
    yield
    assert left_behind(streams_jvms, wait_s=5) == []


def check_run(run: dict, transactional_stores: bool) -> None:
    truth = audit.expected_counts(data.generate(RECORDS, seed=0))
    assert run["transactional_stores"] is transactional_stores
    assert run["produced"] == RECORDS and run["state_expected"] == truth
    assert run["state_actual"] == truth and run["verdict"] == "exactly once", run
    assert (run["lost"], run["duplicated"]) == (0, 0)
    # killed between two commits: the open transaction's output is in the log, aborted
    assert run["aborted_in_log"] > 0
    assert 0 < run["committed_at_kill"] < RECORDS
    # The restarted instance read back every committed changelog record (one per committed
    # input record): a full restore, with or without transactional stores.
    assert run["restored_records"] == run["committed_at_kill"], run["restores"]
    assert 0 < run["resume_s"] < 60


def test_without_transactional_stores_the_counts_are_exact_after_a_full_restore(cluster):
    run = experiments.run("streams-restore", cluster=cluster, transactional_stores=False,
                          records=RECORDS)
    check_run(json.loads(run.to_json()), transactional_stores=False)
    assert run.topics["changelog"].endswith("-running-count-changelog")
    assert [what for _, what in run.steps][1].startswith("SIGKILL the app's JVM")


def test_cli_with_transactional_stores_runs_and_measures_the_same_full_restore(bootstrap):
    """`labkit scenario streams-restore --transactional-stores --json`: one JSON object."""
    import subprocess

    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap}
    out = subprocess.run([str(LABKIT), "scenario", "streams-restore", "--transactional-stores",
                          "--records", str(RECORDS), "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    check_run(json.loads(out.stdout), transactional_stores=True)


def test_a_run_that_fails_half_way_leaves_no_jvm(cluster, monkeypatch):
    def fails(*args, **kwargs):
        assert streams_jvms(), "the restarted app runs when the run fails"
        raise RuntimeError("the run fails while the restarted app runs")

    monkeypatch.setattr(streams_restore, "_wait_done", fails)
    with pytest.raises(RuntimeError, match="fails while the restarted app runs"):
        streams_restore.streams_restore(cluster.bootstrap, transactional_stores=True,
                                        records=RECORDS)
    assert streams_jvms() == []


def test_too_few_records_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="records must be 100 or more"):
        experiments.run("streams-restore", cluster="localhost:1", records=10)
