"""`labkit scenario`: one JSON object with the contract keys; bad input lists the choices."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from labkit.checking.audit import REPORT_KEYS
from labkit.cli import app
from labkit.widgets.sequence import sequence_picture, steps

LABKIT = Path(sys.executable).with_name("labkit")


def test_scenario_json_is_one_object_with_the_contract_keys(bootstrap):
    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap}
    out = subprocess.run(
        [str(LABKIT), "scenario", "consume-transform-produce", "--guarantee", "at_least_once",
         "--crash-at", "after-process-before-commit", "--records", "40", "--json"],
        capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)  # the whole stdout is one JSON object
    assert list(report) == list(REPORT_KEYS) and len(report) == 15
    assert (report["verdict"], report["anomalies"]) == ("at least once", ["duplicate"])
    assert report["aborted_in_log"] == 0  # measured: no transactions, nothing aborted
    assert report["scenario"] == "consume-transform-produce"
    assert report["crash_at"] == "after-process-before-commit" and report["fault"] is None
    assert (report["produced"], report["lost"], report["duplicated"]) == (40, 0, 10)


def test_scenario_summary_with_a_fault(bootstrap, monkeypatch):
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    result = CliRunner().invoke(app, ["scenario", "producer", "-g", "exactly_once",
                                      "--fault", "drop-ack:produce:1", "-n", "20"])
    assert result.exit_code == 0, result.output
    assert "producer [exactly_once]" in result.stdout and "verdict: exactly once" in result.stdout


@pytest.mark.parametrize("args,expected", [
    (["nosuch", "-g", "exactly_once"], ["consume-transform-produce", "running-count"]),
    (["consumer", "-g", "twice"], ["at_most_once", "at_least_once", "exactly_once"]),
    (["consumer", "-g", "exactly_once", "--crash-at", "nowhere"], ["after-poll-before-process"]),
    (["consumer", "-g", "exactly_once", "--crash-at", "after-commit-before-process"],
     ["not on the path", "in-transaction-before-commit"]),
    (["consume-transform-produce", "-g", "exactly_once", "--instances", "0"],
     ["instances must be a positive whole number"]),
    (["consume-transform-produce", "-g", "exactly_once", "--group-protocol", "eager"],
     ["unknown group protocol", "classic, consumer"]),
    (["zombie-rebalance", "-g", "exactly_once", "--fencing", "sometimes"],
     ["unknown fencing", "group, none"]),
    (["zombie-rebalance", "-g", "at_least_once"], ["exactly_once experiment"]),
    (["running-count", "-g", "exactly_once", "--instances", "2", "--partitions", "2"],
     ["runs as one instance", "consume-transform-produce"]),
    (["consume-transform-produce", "-g", "exactly_once", "--fencing", "none"],
     ["--fencing applies to zombie-rebalance only"]),
    (["producer", "-g", "exactly_once", "--fault", "explode:now"], ["drop-ack:produce:N"]),
])
def test_bad_values_exit_non_zero_with_the_valid_choices(args, expected, bootstrap, monkeypatch):
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    result = CliRunner().invoke(app, ["scenario", *args])
    assert result.exit_code != 0
    for text in expected:
        assert text in result.stderr, result.stderr


def test_spark_scenario_names_are_dispatched_to_the_spark_registry(bootstrap, monkeypatch):
    from labkit.experiments import scenarios
    from labkit.checking.audit import AuditReport
    from labkit.spark.scenarios import SPARK_SCENARIOS

    calls = []

    def probe(bootstrap_, guarantee, crash_at, records, keep_topics=True):
        calls.append((bootstrap_, guarantee, crash_at, records, keep_topics))
        return AuditReport("spark-probe", guarantee, crash_at, produced=records)

    monkeypatch.setitem(SPARK_SCENARIOS, "spark-probe", probe)
    report = scenarios.run("spark-probe", "exactly_once", "spark-after-commit", records=7,
                           bootstrap=bootstrap)
    # kept by default from Python; `labkit scenario` passes keep_topics=False
    assert calls == [(bootstrap, "exactly_once", "spark-after-commit", 7, True)]
    assert report.produced == 7
    assert "spark-probe" in scenarios.names()
    with pytest.raises(ValueError, match="network faults are not available"):
        scenarios.run("spark-probe", "exactly_once", fault="drop-ack:produce:1", bootstrap=bootstrap)
    with pytest.raises(ValueError, match="Valid guarantees"):
        scenarios.run("spark-probe", "twice", bootstrap=bootstrap)


def test_more_instances_than_partitions_runs_and_says_some_stay_idle(bootstrap, monkeypatch):
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    result = CliRunner().invoke(app, ["scenario", "consume-transform-produce", "-g",
                                      "exactly_once", "--instances", "3", "--partitions", "2",
                                      "-n", "30", "--json"])
    assert result.exit_code == 0, result.output
    assert "1 instance(s) will stay idle" in result.stderr
    report = json.loads(result.stdout)
    assert (report["produced"], report["lost"], report["duplicated"]) == (30, 0, 0)


def test_trace_writes_the_workers_protocol_exchanges_in_order(bootstrap, tmp_path):
    trace = tmp_path / "t.jsonl"
    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap}
    out = subprocess.run(
        [str(LABKIT), "scenario", "consume-transform-produce", "--guarantee", "exactly_once",
         "--trace", str(trace), "--records", "20", "--json"],
        capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["verdict"] == "exactly once"
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert all({"api", "version", "client_id", "correlation_id", "error", "ms"} <= set(r)
               for r in rows)
    apis = [r["api"] for r in rows]
    # one transaction, in protocol order, each step after the one before it
    order = ["InitProducerId", "AddPartitionsToTxn", "Produce", "AddOffsetsToTxn",
             "TxnOffsetCommit", "EndTxn"]
    at = -1
    for api in order:
        assert api in apis[at + 1:], (api, apis)
        at = apis.index(api, at + 1)
    # librdkafka speaks the classic transaction protocol: the epoch stays flat per transaction
    epochs = {r["producer_epoch"] for r in rows if r["api"] == "EndTxn"}
    assert len([r for r in rows if r["api"] == "EndTxn"]) >= 2 and len(epochs) == 1, epochs
    # (JoinGroup's MEMBER_ID_REQUIRED and a coordinator still loading are normal on the way)
    assert not [r for r in rows if r["error"] and r["api"] in order], rows
    # the sequence diagram is drawn from exactly that: one transaction, as sent
    first = steps(rows)
    assert first[0]["api"] == "InitProducerId" and first[-1]["api"] == "EndTxn"
    assert [r["api"] for r in first if r["api"] != "Produce"] == [a for a in order if a != "Produce"]
    assert sequence_picture(first).png.startswith(b"\x89PNG")
