"""The transaction coordinator dies under an exactly-once consume-transform-produce loop,
once mid-transaction and once between EndTxn and the COMMIT markers (the partitions'
leader frozen so no marker can be written first): each input record is in the output once,
read_committed, in every run. Three runs in CI: one here on a failure lab, one through the
CLI, and notebook 05b's (whose audit nbval compares).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

from labkit import coordinator_failover, failover
from labkit.clientlog import client_config
from labkit.exercises.coordinator import check_next_coordinator, judge
from tests.test_failover import lab_jvms

RECORDS = 60
LABKIT = Path(sys.executable).with_name("labkit")


@pytest.fixture(scope="module")
def lab():
    with failover.failure_lab() as cluster:
        yield cluster


def test_an_exactly_once_loop_survives_its_coordinator_dying_twice(lab):
    run = coordinator_failover.coordinator_failover(lab, records=RECORDS)
    report = run.report
    assert (report.produced, report.delivered_unique, report.lost, report.duplicated,
            report.aborted_visible) == (RECORDS, RECORDS, 0, 0, 0), run.timeline()
    # the coordinator moved at each kill, and the second kill came after EndTxn returned
    # while no marker could have been written yet
    first, second, third = run.coordinators
    assert first != second != third, run.coordinators
    assert "frozen: no marker can be written" in run.timeline(), run.timeline()
    assert "SIGKILLed before it could write the markers" in run.timeline()


def test_the_cli_reports_exactly_once_and_leaves_no_jvm(tmp_path):
    env = {**os.environ, "LABKIT_HOME": str(tmp_path), "LABKIT_BOOTSTRAP": "127.0.0.1:9"}
    out = subprocess.run([str(LABKIT), "scenario", "coordinator-failover", "--records",
                          str(RECORDS), "--json"],
                         capture_output=True, text=True, env=env, timeout=400)
    assert out.returncode == 0, out.stderr
    run = json.loads(out.stdout)
    assert (run["scenario"], run["lost"], run["duplicated"], run["aborted_visible"],
            run["delivered_unique"]) == ("coordinator-failover", 0, 0, 0, RECORDS), run
    assert len(run["coordinators"]) == 3
    assert lab_jvms(str(tmp_path)) == []
    assert list(tmp_path.glob("failure-lab-*")) == []


def test_the_next_coordinator_is_the_first_in_sync_replica_in_replica_order(lab):
    """The rule notebook 05b's exercise asks for, measured: kill an id's coordinator, ask
    the brokers where the id went. A wrong guess gets a hint, not the answer."""
    tid = "fee-service-rule"
    Producer(client_config({"bootstrap.servers": lab.bootstrap, "transactional.id": tid,
                            "log_level": 2})).init_transactions(60)
    _, state = coordinator_failover.transaction_state_partition(lab, tid)
    predicted = next(r for r in state.replicas if r != state.leader and r in state.isr)
    before, after = coordinator_failover.kill_coordinator(lab, tid)
    assert (before, after) == (state.leader, predicted), state
    wrong = next(b for b in failover.BROKERS if b not in (before, after))
    hint = judge(wrong, before, after)
    assert not hint.passed and f"broker {after}" not in hint.message
    assert "fill in" in check_next_coordinator(lab, tid, None).message
    assert "must be a broker id" in check_next_coordinator(lab, tid, 7).message
