"""The late write (issue 51): a transactional request kept by the proxy until its client gave
up on it and went on into its next transaction, then delivered. Every assertion is read
from the broker: its answer to the late request (the proxy's wire trace), its transaction
state just before (DescribeTransactions, DescribeProducers), the log's batches and markers
(producer id and epoch) and what a read_committed reader sees, against what the app meant.

Measured on Kafka 4.4 (docs/measurements.md, "Stop 55"): only librdkafka's late EndTxn gets
in; the three others are refused by the producer epoch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import experiments
from labkit.checking import stored
from labkit.checking.record import RunRecord
from labkit.experiments.recheck import recheck
from tests.test_stored_runs import checked_again, kafka_forbidden, no_kafka  # noqa: F401

LABKIT = Path(sys.executable).with_name("labkit")


def late_write(client: str, hold: str) -> RunRecord:
    return experiments.run("late-write", client=client, hold=hold, announce=lambda line: None)


def in_log(run: dict) -> dict[str, tuple]:
    """Each record id -> (its batch's epoch, the marker after it, that marker's epoch)."""
    return {r["id"]: (r["producer_epoch"], r["marker"], r["marker_epoch"]) for r in run["log"]}


def test_librdkafka_a_late_commit_ends_the_next_transaction_from_the_cli(bootstrap):
    """The classic protocol: txn 1's commit, delivered while txn 2 is open at the same
    epoch, is taken for txn 2's. The record the app then aborts is committed: an aborted
    read, and the app's own abort is refused."""
    out = subprocess.run([str(LABKIT), "scenario", "late-write", "--client", "librdkafka",
                          "--hold", "endtxn", "--json"], capture_output=True, text=True,
                         env={**os.environ, "LABKIT_BOOTSTRAP": bootstrap}, timeout=120)
    assert out.returncode == 0, out.stderr
    run = json.loads(out.stdout)
    late = run["late"]
    assert (late["api"], late["version"], late["accepted"]) == ("EndTxn", 1, True), late
    assert late["carried"]["committed"] and late["carried"]["producer_epoch"] == 0, late
    assert run["broker_then"] == {"coordinator_state": "Ongoing", "coordinator_epoch": 0,
                                  "partition_epoch": 0}, run["broker_then"]
    # one epoch throughout: t2 committed by a marker of the same epoch as txn 1's
    assert in_log(run) == {"t1": (0, "COMMIT", 0), "t2": (0, "COMMIT", 0)}, run["log"]
    assert run["believed"] == {"t1": "committed", "t2": "aborted"}, run["believed"]
    assert run["client_errors"]["t2"].startswith("INVALID_TXN_STATE"), run["client_errors"]
    assert (run["aborted_visible"], run["lost"], run["verdict"], run["anomalies"]) == \
        (1, 0, "incorrect", ["aborted-read"]), run


@pytest.mark.parametrize("client, hold, error", [
    ("librdkafka", "produce", "INVALID_PRODUCER_EPOCH"),  # KIP-360: a timed-out record bumps
    ("java", "produce", "INVALID_PRODUCER_EPOCH"),        # TV2: every transaction end bumps
    ("java", "endtxn", "PRODUCER_FENCED"),
])
def test_the_late_request_is_refused_by_the_producer_epoch(client, hold, error, tmp_path,
                                                            no_kafka):
    record = late_write(client, hold)
    run = json.loads(record.to_json())
    late, then = run["late"], run["broker_then"]
    assert (late["accepted"], late["error"]) == (False, error), late
    # it carried epoch 0; the broker had moved on to a newer epoch before it arrived
    assert late["carried"]["producer_epoch"] == 0 < then["partition_epoch"], (late, then)
    assert then["coordinator_state"] == "Ongoing", then
    assert (run["aborted_visible"], run["lost"], run["duplicated"]) == (0, 0, 0), run
    if hold == "produce":  # t1 never reached the log; t2 committed at the newer epoch
        assert late["carried"]["records"] == ["t1"], late
        assert list(in_log(run)) == ["t2"] and in_log(run)["t2"][1] == "COMMIT", run["log"]
        assert run["believed"] == {"t1": "aborted", "t2": "committed"}, run["believed"]
    else:  # TV2: a marker one epoch above its records; t2 aborted as the app asked
        assert late["version"] == 5 and not run["client_errors"], run
        assert in_log(run) == {"t1": (0, "COMMIT", 1), "t2": (1, "ABORT", 2)}, run["log"]
    # stored and checked again without Kafka (issue 50): what the app said and the output,
    # both in the history, give the live verdict
    path = record.store(tmp_path / "late.jsonl")
    checked_again(record, path, no_kafka)
    if hold == "produce":  # the app's intent is read from its stored lines: t2 "aborted"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for e in lines:
            if e.get("kind") == "said" and e["said"].get("txn") == "t2" \
                    and e["said"]["event"] == "ended":
                e["said"]["asked"] = "abort"
        path.write_text("".join(json.dumps(e) + "\n" for e in lines))
        with kafka_forbidden(no_kafka):
            edited = recheck(stored.load(path))
        assert (edited.report.aborted_visible, edited.report.anomalies) == \
            (1, ["aborted-read"]), edited.report.summary()
