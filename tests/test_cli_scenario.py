"""`labkit scenario`: one JSON object with the contract keys; bad input lists the choices."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from confluent_kafka import Producer

from labkit.checking.audit import REPORT_KEYS
from labkit.kafka import topics
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
     ["group_protocol must be one of classic, consumer"]),
    (["zombie-rebalance", "-g", "exactly_once", "--fencing", "sometimes"],
     ["fencing must be one of group, none"]),
    (["zombie-rebalance", "-g", "at_least_once"], ["guarantee must be one of exactly_once"]),
    (["running-count", "-g", "exactly_once", "--instances", "2", "--partitions", "2"],
     ["runs as one instance", "consume-transform-produce"]),
    (["consume-transform-produce", "-g", "exactly_once", "--fencing", "none"],
     ["No such option: --fencing"]),
    (["consumer"], ["consumer needs --guarantee at_most_once | at_least_once | exactly_once"]),
    (["producer", "-g", "exactly_once", "--fault", "explode:now"], ["drop-ack:produce:N"]),
])
def test_bad_values_exit_non_zero_with_the_valid_choices(args, expected, bootstrap, monkeypatch):
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    result = CliRunner().invoke(app, ["scenario", *args])
    assert result.exit_code != 0
    for text in expected:
        assert text in result.stderr, result.stderr


def template_experiment() -> str:
    """The template experiment of docs/adding-an-experiment.md, as written there."""
    doc = (Path(__file__).parents[1] / "docs" / "adding-an-experiment.md").read_text()
    return doc.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_template_is_a_composition_in_under_40_lines():
    code = template_experiment()
    assert len(code.strip().splitlines()) < 40, len(code.splitlines())
    assert "body=" not in code and "def body" not in code  # parts, not a runner
    for part in ("workload=", "clients=", "nemesis=", "checkers="):
        assert part in code


def test_a_new_experiment_is_one_module_and_the_cli_lists_and_runs_it(bootstrap, tmp_path,
                                                                       monkeypatch):
    """Adding an experiment is adding one module of parts that registers itself: `labkit
    scenario` lists it with its help, takes its options and runs it against the real
    broker; Python runs it with another pipeline in place of the reference one."""
    import labkit.experiments as package
    from labkit.experiments import registry

    # the lab's experiments registered first (imported once per process), then a copy of
    # the registry that the template joins and that is undone after
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry.catalog()))
    (tmp_path / "lost_ack_template.py").write_text(template_experiment())
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "labkit.experiments.lost_ack_template", raising=False)
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    listing = CliRunner().invoke(app, ["scenario", "--help"], env={"COLUMNS": "200"}).output
    assert "lost-ack-template" in listing and "the first produce ack lost" in listing
    assert "torture" in listing  # labkit torture is an experiment like the others
    own = CliRunner().invoke(app, ["scenario", "lost-ack-template", "--help"],
                             env={"COLUMNS": "200"}).output
    words = " ".join(own.replace("│", " ").split())
    assert "--idempotent --no-idempotent" in words and "enable.idempotence" in words, words
    assert "(default 120)" in words  # the watchdog's limit, every experiment's --stall-after
    result = CliRunner().invoke(app, ["scenario", "lost-ack-template", "--no-idempotent",
                                      "-n", "10", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["produced"], report["lost"], report["verdict"]) == \
        (10, 0, "at least once"), report
    assert report["duplicated"] > 0, report  # the retry of the batch whose ack was lost
    refused = CliRunner().invoke(app, ["scenario", "lost-ack-template", "--idempotent",
                                       "-n", "0"])
    assert refused.exit_code == 2 and "records must be 1 or more" in refused.stderr
    # from Python, the learner's producer in place of the template's
    from labkit import experiments

    def send_idempotent(bootstrap, topic, payments, idempotent):
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        for payment in payments:
            producer.produce(topic, topics.encode(payment))
        producer.flush(30)

    run = experiments.run("lost-ack-template", cluster=bootstrap, idempotent=False, records=10,
                          pipeline=send_idempotent)
    assert (run.report.lost, run.report.duplicated, run.verdict) == (0, 0, "exactly once")
    assert isinstance(run, registry.Run) and run.topics["output"].startswith("lost-ack-")
    with pytest.raises(ValueError, match="takes no option colour; its options: idempotent, "
                                         "records"):
        experiments.run("lost-ack-template", cluster=bootstrap, idempotent=True, colour="red")


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
    # (JoinGroup's MEMBER_ID_REQUIRED and a coordinator still loading are normal on the way,
    # and so is CONCURRENT_TRANSACTIONS on the next AddPartitionsToTxn: the coordinator is
    # still writing the last transaction's markers, and librdkafka retries)
    assert not [r for r in rows if r["error"] and r["api"] in order
                and (r["api"], r["error"]) != ("AddPartitionsToTxn", "CONCURRENT_TRANSACTIONS")], rows
    # the sequence diagram is drawn from exactly that: one transaction, as sent
    first = steps(rows)
    assert first[0]["api"] == "InitProducerId" and first[-1]["api"] == "EndTxn"
    assert [r["api"] for r in first if r["api"] != "Produce"] == [a for a in order if a != "Produce"]
    assert sequence_picture(first).png.startswith(b"\x89PNG")
