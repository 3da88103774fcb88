"""The transaction coordinator dies under an exactly-once consume-transform-produce loop,
once mid-transaction and once between EndTxn and the COMMIT markers (the partitions'
leader frozen so no marker can be written first): each input record is in the output once,
read_committed, in every run. Three runs in CI: one here on a failure lab, one through the
CLI, and notebook 05b's (whose audit nbval compares).
"""
from __future__ import annotations

import time

import psutil
import pytest
from confluent_kafka import Producer

from labkit import coordinator_failover, failover
from labkit.clientlog import client_config
from labkit.coordinator_failover import errors_by_class
from labkit.exercises.coordinator import check_next_coordinator, judge
from tests.test_failover import scenario_on_a_lab_of_its_own

RECORDS = 60


def test_an_exactly_once_loop_survives_its_coordinator_dying_twice(failure_lab):
    run = coordinator_failover.coordinator_failover(failure_lab, records=RECORDS)
    report = run.report
    assert (report.produced, report.delivered_unique, report.lost, report.duplicated,
            report.aborted_visible) == (RECORDS, RECORDS, 0, 0, 0), run.timeline()
    # the coordinator moved at each kill, and the second kill came after EndTxn returned
    # while no marker could have been written yet
    first, second, third = run.coordinators
    assert first != second != third, run.coordinators
    assert "frozen: no marker can be written" in run.timeline(), run.timeline()
    assert "SIGKILLed before it could write the markers" in run.timeline()


def test_a_freeze_the_commit_outlasts_is_lifted_by_its_timer(failure_lab, monkeypatch):
    """The deadlock breaker: a commit that needs the frozen broker (its coordinator's ISR
    too small without it) gets it back after FREEZE_LIMIT_S, and the run says so."""
    monkeypatch.setattr(coordinator_failover, "FREEZE_LIMIT_S", 3)
    window = coordinator_failover.FreezeWindow(failure_lab, 2)
    process = psutil.Process(failure_lab.broker(2).pid)
    window.start()
    frozen_at = time.monotonic()
    failover.wait_until(lambda: process.status() == psutil.STATUS_STOPPED, "the freeze", 2)
    failover.wait_until(lambda: process.status() != psutil.STATUS_STOPPED, "the timer's thaw", 10)
    assert time.monotonic() - frozen_at >= 3
    assert window.stop_timer() is True
    window.end()  # the timer thawed it already: nothing left to do, no error


def test_the_cli_reports_exactly_once_and_leaves_no_jvm(tmp_path):
    run = scenario_on_a_lab_of_its_own(tmp_path, 400, "coordinator-failover",
                                       "--records", str(RECORDS))
    assert (run["scenario"], run["lost"], run["duplicated"], run["aborted_visible"],
            run["delivered_unique"]) == ("coordinator-failover", 0, 0, 0, RECORDS), run
    assert len(run["coordinators"]) == 3


def test_the_next_coordinator_is_the_first_in_sync_replica_in_replica_order(failure_lab):
    """The rule notebook 05b's exercise asks for, measured: kill an id's coordinator, ask
    the brokers where the id went. A wrong guess gets a hint, not the answer."""
    tid = "fee-service-rule"
    Producer(client_config({"bootstrap.servers": failure_lab.bootstrap, "transactional.id": tid,
                            "log_level": 2})).init_transactions(60)
    _, state = coordinator_failover.transaction_state_partition(failure_lab, tid)
    predicted = next(r for r in state.replicas if r != state.leader and r in state.isr)
    before, after = coordinator_failover.kill_coordinator(failure_lab, tid)
    assert (before, after) == (state.leader, predicted), state
    wrong = next(b for b in failover.BROKERS if b not in (before, after))
    hint = judge(wrong, before, after)
    assert not hint.passed and f"broker {after}" not in hint.message
    assert "fill in" in check_next_coordinator(failure_lab, tid, None).message
    assert "must be a broker id" in check_next_coordinator(failure_lab, tid, 7).message


def test_the_error_table_names_each_class_and_refuses_an_unclassified_error():
    """Notebook 06's table: one row per error as classified() wrote it; anything else is
    refused with what it expects."""
    table = errors_by_class([("a", "_FENCED (fatal)"), ("b", "UNKNOWN_MEMBER_ID (abortable)")])
    assert list(table["class"]) == ["fatal", "abortable"]
    assert table["what the app does"][0].startswith("close this producer")
    with pytest.raises(ValueError, match="as classified\\(\\) writes it"):
        errors_by_class([("c", "UNKNOWN_MEMBER_ID")])
