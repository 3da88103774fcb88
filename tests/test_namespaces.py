"""LABKIT_NAMESPACE: learners sharing one broker never see, join or fence each other.

Everything is judged from the broker: topics, groups and transactional ids are listed with
a plain AdminClient / the inspector (no namespace), and fencing is what the broker answers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from labkit import settings

from labkit.kafka import names, topics
from labkit.cli import app
from labkit.kafka.inspect import Inspector
from labkit.pipelines.guarantee import transactions
from labkit.pipelines.txn import ProducerFenced, Transactions

LABKIT = Path(sys.executable).with_name("labkit")
CTP = "consume-transform-produce"


def _broker_names(bootstrap: str) -> tuple[set[str], set[str]]:
    """Every topic and consumer group on the broker, asked without any namespace."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    groups = admin.list_consumer_groups().result(timeout=30).valid
    return set(admin.list_topics(timeout=10).topics), {g.group_id for g in groups}


def _transactional_ids(bootstrap: str, monkeypatch) -> set[str]:
    monkeypatch.setenv("LABKIT_NAMESPACE", "")  # the inspector then lists every id
    with Inspector(bootstrap) as inspector:
        return set(inspector.transactional_ids())


def test_the_naming_rule():
    os.environ["LABKIT_NAMESPACE"] = "alice"
    try:
        assert names.topic("payments") == "alice.payments"
        assert names.topic("alice.payments") == "alice.payments"  # a broker name stays itself
        assert names.group("bob.payments") == "alice.bob.payments"  # never another's
        assert names.short("alice.payments") == "payments"
        assert names.mine("alice.payments") and not names.mine("alice-bob.payments")
        with pytest.raises(ValueError, match="at most 249"):
            names.topic("x" * 244)
        os.environ["LABKIT_NAMESPACE"] = "a.b"  # a '.' would make prefixes ambiguous
        with pytest.raises(settings.SettingsError, match="LABKIT_NAMESPACE='a.b'"):
            names.topic("payments")
    finally:
        os.environ["LABKIT_NAMESPACE"] = ""  # conftest's: none
    assert names.topic("payments") == "payments"


def test_two_learners_run_the_same_exactly_once_scenario_at_once(bootstrap, monkeypatch):
    # Two `labkit scenario` processes, crashed between sending offsets and committing, at the
    # same time on one broker, as alice and bob.
    runs = {ns: subprocess.Popen(
        [str(LABKIT), "scenario", CTP, "-g", "exactly_once", "--crash-at",
         "after-send-offsets-before-commit", "-n", "40", "--keep-topics", "--json"],
        env={**os.environ, "LABKIT_BOOTSTRAP": bootstrap, "LABKIT_NAMESPACE": ns},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for ns in ("alice", "bob")}
    for ns, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        report = json.loads(out)
        assert (report["verdict"], report["lost"], report["duplicated"]) == \
            ("exactly once", 0, 0), ns

    all_topics, groups = _broker_names(bootstrap)
    txn_ids = _transactional_ids(bootstrap, monkeypatch)
    for ns in ("alice", "bob"):
        own = {t for t in all_topics if t.startswith(f"{ns}.{CTP}-exactly-once-")}
        assert {t.rsplit("-", 1)[1] for t in own} == {"in", "out"}
        run = next(iter(own)).rsplit("-", 1)[0]  # alice.consume-transform-produce-...-<id>
        assert run in groups
        assert f"{run}-txn" in txn_ids  # the crashed instance and its restart: one id
        # what the learner gets: their own topics and groups, none of the other's
        monkeypatch.setenv("LABKIT_NAMESPACE", ns)
        listed = topics.listing(bootstrap)
        assert own <= set(listed) and all(t.startswith(f"{ns}.") for t in listed)
        with Inspector(bootstrap) as inspector:
            assert run in inspector.groups()
            assert all(g.startswith(f"{ns}.") for g in inspector.groups())
            assert f"{run}-txn" in inspector.transactional_ids()
            assert all(t.startswith(f"{ns}.") for t in inspector.transactional_ids())
        # and `labkit inspect` finds the output by the learner's short name
        short = names.short(f"{run}-out")
        shown = CliRunner().invoke(app, ["inspect", short, "--json"],
                                   env={"LABKIT_BOOTSTRAP": bootstrap})
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["topic"] == f"{run}-out"


def test_the_same_transactional_id_in_two_namespaces_fences_no_one(bootstrap, monkeypatch):
    # Each learner's notebook says "ledger-app"; the broker fences by transactional id.
    def open_txn(ns: str) -> Transactions:
        monkeypatch.setenv("LABKIT_NAMESPACE", ns)
        topics.create(bootstrap, "ledger")
        txn = transactions(bootstrap, "ledger-app")
        txn.begin()
        txn.produce("ledger", "k", {"id": f"{ns}-1"})
        return txn

    alice = open_txn("alice2")
    bob = open_txn("bob2")  # init_transactions: would fence alice's if the ids were equal
    alice.commit()
    bob.commit()
    monkeypatch.setenv("LABKIT_NAMESPACE", "alice2")
    assert [r.value["id"] for r in topics.read(bootstrap, "ledger")] == ["alice2-1"]
    assert alice.transactional_id == "alice2.ledger-app"
    # The control: the same id in one namespace (one learner's two kernels) does fence.
    first = open_txn("alice2")
    open_txn("alice2")
    with pytest.raises(ProducerFenced):
        first.commit()


def test_labkit_scenario_deletes_its_topics_unless_kept(bootstrap, monkeypatch):
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    monkeypatch.setenv("LABKIT_NAMESPACE", "carol")
    args = ["scenario", CTP, "-g", "at_least_once", "-n", "20", "--json"]
    gone = CliRunner().invoke(app, args)
    assert gone.exit_code == 0, gone.output
    assert not [t for t in _broker_names(bootstrap)[0] if t.startswith("carol.")]
    kept = CliRunner().invoke(app, [*args, "--keep-topics"])
    assert kept.exit_code == 0, kept.output
    left = sorted(t for t in _broker_names(bootstrap)[0] if t.startswith("carol."))
    assert [t.rsplit("-", 1)[1] for t in left] == ["in", "out"]
    assert json.loads(kept.stdout)["produced"] == 20
    # `labkit status` names the namespace and where it comes from
    status = json.loads(CliRunner().invoke(app, ["status", "--json"]).stdout)
    assert (status["namespace"], status["namespace_from"]) == ("carol", "from LABKIT_NAMESPACE")


def test_clean_topics_deletes_one_namespace_and_nothing_else(bootstrap, monkeypatch):
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    monkeypatch.setenv("LABKIT_NAMESPACE", "")
    topics.create(bootstrap, "erin.payments", "erin.counts", "frank.payments", "erin-bare")
    refused = CliRunner().invoke(app, ["clean-topics", "--yes"])  # no namespace: all is "mine"
    assert refused.exit_code == 2 and "set LABKIT_NAMESPACE" in refused.stderr
    monkeypatch.setenv("LABKIT_NAMESPACE", "erin")
    kept = CliRunner().invoke(app, ["clean-topics"], input="n\n")
    assert kept.exit_code == 1 and "2 topic(s) in namespace erin" in kept.stdout
    done = CliRunner().invoke(app, ["clean-topics", "--yes"])
    assert done.exit_code == 0 and "deleted 2 topic(s)" in done.stdout, done.output
    on_broker = _broker_names(bootstrap)[0]
    assert not {"erin.payments", "erin.counts"} & on_broker
    assert {"frank.payments", "erin-bare"} <= on_broker  # another's, and a name not in it
    monkeypatch.setenv("LABKIT_NAMESPACE", "")
    topics.delete(bootstrap, "frank.payments", "erin-bare")


def test_an_invalid_namespace_gets_the_settings_message(bootstrap, monkeypatch):
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    monkeypatch.setenv("LABKIT_NAMESPACE", "alice smith")
    for args in (["scenario", CTP, "-g", "at_least_once", "-n", "4"], ["status"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2
        assert "LABKIT_NAMESPACE='alice smith': use letters, digits" in result.stderr
    assert not [t for t in _broker_names(bootstrap)[0] if t.startswith("alice smith")]


def test_torture_hands_the_app_its_namespaced_names(bootstrap, monkeypatch):
    # An app the lab did not write (plain confluent-kafka, no labkit) under `labkit torture`
    # as dave: it only knows what the environment says, and the broker holds dave's names.
    from labkit.torture import harness

    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    monkeypatch.setenv("LABKIT_NAMESPACE", "dave")
    app_ = [sys.executable, str(Path(__file__).parents[1] / "examples" / "torture" /
                                "exactly_once_app.py"), "--work-ms", "5"]
    result = harness.torture(app_, records=30, kills=1, seed=1, kill_after=(0.5, 1.0),
                             keep_topics=True)
    assert result.verdict == "exactly once"
    made = [result.topics["input"], result.topics["output"]]
    assert all(t.startswith("dave.torture-") for t in made)
    group = made[0].removesuffix("-in")
    all_topics, groups = _broker_names(bootstrap)
    assert set(made) <= all_topics and group in groups  # the app committed as dave's group
    monkeypatch.setenv("LABKIT_NAMESPACE", "")
    assert group in _transactional_ids(bootstrap, monkeypatch)  # and wrote as dave's id
    topics.delete(bootstrap, *made)


def test_a_spark_scenario_deletes_its_input_and_output_topics(bootstrap, monkeypatch):
    # What `labkit scenario spark-kafka-sink` does after its audit (no Spark needed for that
    # step): the experiment's two topics, made by its workload in the namespace, are gone
    # from the broker when its run context closes.
    from labkit.experiments.context import RunContext
    from labkit.experiments.parts import prepare
    from labkit.experiments.registry import get

    monkeypatch.setenv("LABKIT_NAMESPACE", "frank")
    experiment = get("spark-kafka-sink")
    run = RunContext(experiment.name, experiment.resolve(
        {"guarantee": "at_least_once", "keep_topics": False}), bootstrap=bootstrap)
    run.run_id = "x1"
    prepare(run, experiment.workload(run.o))
    assert list(run.topics.values()) == ["frank.spark-kafka-sink-x1-in",
                                         "frank.spark-kafka-sink-x1-out"]
    assert set(run.topics.values()) <= _broker_names(bootstrap)[0]
    run.close()
    assert not [t for t in _broker_names(bootstrap)[0] if t.startswith("frank.")]
