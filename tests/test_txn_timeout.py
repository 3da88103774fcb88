"""A batch slower than transaction.timeout.ms under the exactly-once loop of notebook 05b:
the coordinator aborts its transaction, librdkafka reports the producer fenced (fatal), the
app starts a new producer and processes the batch again. Measured on the real broker: the
aborted batch is in the log, a read_committed reader gets each input once."""
from __future__ import annotations

import json
import os
import subprocess

import psutil

from labkit import experiments
from labkit.experiments import txn_timeout
from tests.test_failover import LABKIT, refused_before_any_broker
from tests.test_harness import left_behind

RECORDS = 30


def test_a_batch_slower_than_the_transaction_timeout_is_aborted_and_processed_again(bootstrap):
    run = experiments.run("txn-timeout", cluster=bootstrap, records=RECORDS)
    r = run.report
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated, r.aborted_visible) == \
        (RECORDS, RECORDS, 0, 0, 0), run.timeline()
    # the slow batch's 10 records are in the log, aborted by the coordinator, not by the app
    assert r.aborted_in_log == txn_timeout.BATCH, run.timeline()
    assert run.errors == ["_FENCED (fatal)"] and run.producers == 2, run.timeline()
    # open at least the timeout, as the log shows it (from the aborted records' CreateTime to
    # the ABORT marker): the app's own wait, started once the batch was written, saw 2.9 s of
    # a 3 s timeout once (the transaction was older than the wait)
    assert run.open_ms >= txn_timeout.TIMEOUT_MS, (run.open_ms, run.timeline())


def test_a_commit_cut_off_from_its_coordinator_is_aborted_and_never_read_committed(bootstrap):
    # The CLI as a learner runs it: the producer's EndTxn (and all it sends after) is held in
    # the network until the coordinator aborts the transaction for its timeout.
    out = subprocess.run([str(LABKIT), "scenario", "txn-timeout", "--cut", "--json"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "LABKIT_BOOTSTRAP": bootstrap})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    batch = txn_timeout.BATCH
    # while its commit hung, the open transaction's records were in the log, not readable
    assert (got["open_in_log"], got["visible_while_open"]) == (2 * batch, batch), got
    # aborted by the coordinator: still nothing of it for a read_committed reader
    assert got["visible_after_abort"] == batch, got
    assert (got["aborted_in_log"], got["aborted_visible"], got["lost"], got["duplicated"]) == \
        (batch, 0, 0, 0), got
    # the held commit reached the coordinator after the abort: the producer is fenced, the
    # app starts another and processes the batch again
    assert got["errors"] == ["_FENCED (fatal)"] and got["producers"] == 2, got
    assert got["verdict"] == "exactly once"
    # nothing the CLI started outlives it: its workers (and the proxy, in its own process)
    if "LABKIT_BOOTSTRAP" not in os.environ:  # else every process here has this address
        assert started_for(bootstrap) == [], "left running after the CLI exited"


def started_for(bootstrap: str) -> list[str]:
    """Processes whose environment names ``bootstrap`` as LABKIT_BOOTSTRAP (what the CLI
    was given, and what its children inherit), once they have had time to be reaped."""
    def find() -> list[str]:
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.environ().get("LABKIT_BOOTSTRAP") == bootstrap:
                    found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:120]}")
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
        return found
    return left_behind(find)


def test_the_cli_refuses_what_the_scenario_cannot_run_before_writing_anything(tmp_path):
    refused_before_any_broker(tmp_path, "txn-timeout", [
        (["--records", "20"], "records must be 30 or more"),
        (["-g", "at_least_once"], "No such option"),
        (["--acks", "1"], "No such option: --acks")])
