"""The `streams-restore` experiment on the real broker and real Kafka Streams 4.4.0: the lab's
running count under exactly_once_v2, SIGKILLed half way and restarted on the same state
directory, with and without transactional state stores (KIP-892).

Measured (docs/measurements.md, "Kafka Streams restore after an exactly-once crash
(KIP-892)"): the counts are exact in both modes. With the lab's short keys the store never
leaves RocksDB's memtable (Kafka Streams runs RocksDB without its write-ahead log), so a
SIGKILL takes all of it and both modes restore every committed changelog record (one per
committed input record: the app has no record cache). With 16 KiB keys RocksDB flushes the
store while the app runs, and with transactional stores the restore starts at the offset
flushed with it: fewer records than were committed."""
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

RECORDS = 1000  # ~4 s of work at 4 ms a record: the kill lands half way
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


def check_run(run: dict, transactional_stores: bool, key_bytes: int = 0) -> None:
    truth = audit.expected_counts(data.generate(run["records"], seed=0,
                                                keys=streams_restore.keys_of(key_bytes)))
    assert run["transactional_stores"] is transactional_stores
    assert run["produced"] == run["records"] and run["state_expected"] == truth
    assert run["state_actual"] == truth and run["verdict"] == "exactly once", run["restores"]
    assert (run["lost"], run["duplicated"]) == (0, 0)
    # killed between two commits: the open transaction's output is in the log, aborted
    assert run["aborted_in_log"] > 0
    assert 0 < run["committed_at_kill"] < run["records"]
    assert 0 < run["resume_s"] < 60


@pytest.mark.parametrize("transactional_stores", [False, True])
def test_a_small_state_is_restored_in_full_and_the_counts_are_exact(cluster,
                                                                     transactional_stores):
    run = experiments.run("streams-restore", cluster=cluster, records=RECORDS,
                          transactional_stores=transactional_stores)
    check_run(json.loads(run.to_json()), transactional_stores)
    # Every committed changelog record read back, transactional stores or not: nothing of
    # the store had reached the disk when the JVM was killed.
    assert run.restored_records == run.committed_at_kill, run.restores
    assert run.topics["changelog"].endswith("-running-count-changelog")
    assert [step.what for step in run.steps][1].startswith("SIGKILL the app's JVM")


def test_cli_transactional_stores_keep_a_flushed_state(bootstrap):
    """`labkit scenario streams-restore --transactional-stores --key-bytes 16384 --json`:
    RocksDB has flushed the store (~1,000 writes of 16 KiB fill its 16 MiB memtable) before
    the kill at ~1,500 committed records, so the restore starts at the flushed offset."""
    import subprocess

    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap}
    out = subprocess.run([str(LABKIT), "scenario", "streams-restore", "--transactional-stores",
                          "--key-bytes", "16384", "--records", "3000", "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run = json.loads(out.stdout)  # the whole stdout is one JSON object
    check_run(run, transactional_stores=True, key_bytes=16384)
    assert 0 < run["restored_records"] < run["committed_at_kill"], run["restores"]


def test_a_run_that_fails_half_way_leaves_no_jvm(cluster, monkeypatch):
    def fails(*args, **kwargs):
        assert streams_jvms(), "the restarted app runs when the run fails"
        raise RuntimeError("the run fails while the restarted app runs")

    monkeypatch.setattr(streams_restore, "_wait_done", fails)
    with pytest.raises(RuntimeError, match="fails while the restarted app runs"):
        experiments.run("streams-restore", cluster=cluster, transactional_stores=True,
                        records=RECORDS)
    assert streams_jvms() == []


def test_too_few_records_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="records must be 100 or more"):
        experiments.run("streams-restore", cluster="localhost:1", records=10)
