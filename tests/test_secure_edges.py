"""The clients that are not librdkafka against a real SASL_SSL broker (issue 11): the
inspector's own protocol connection, the fault proxy's upstream side, Spark's Kafka source
and sink, and the harness's apps (Python, and Kafka's Java copier).

One secure broker for the module (``labkit up --secure``'s: SCRAM-SHA-512, a generated CA,
ACLs on), with LABKIT_KAFKA_CONFIG pointing at the client.properties it wrote. Its only
client listener is SASL_SSL, so every record these tests find went through TLS and SCRAM.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from labkit import settings
from labkit import experiments
from labkit.experiments import scenarios
from labkit.kafka import protocol
from labkit.pipelines import data
from labkit.torture import harness
from labkit.kafka.inspect import describe_topic
from labkit.kafka.localcluster import LocalCluster

PYTHON_APP = [sys.executable, "examples/torture/exactly_once_app.py"]
COPIER = [sys.executable, "-m", "labkit.torture.apps", "copier"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def secure_lab(tmp_path_factory: pytest.TempPathFactory):
    """A secure broker of the module's own, LABKIT_KAFKA_CONFIG set while the module runs;
    the broker is stopped and the variable restored on every path."""
    cluster = LocalCluster(brokers=1, home=tmp_path_factory.mktemp("secure"), secure=True)
    before = os.environ.get(settings.KAFKA_CONFIG)
    try:
        cluster.start()
        os.environ[settings.KAFKA_CONFIG] = str(cluster.client_properties)
        yield cluster
    finally:
        if before is None:
            os.environ.pop(settings.KAFKA_CONFIG, None)
        else:
            os.environ[settings.KAFKA_CONFIG] = before
        cluster.kill()
        cluster.stop()


def test_the_inspector_reads_batches_and_markers_from_the_secure_lab(secure_lab):
    from labkit.spark.scenarios import load_transactional

    topic = f"secure-inspect-{uuid.uuid4().hex[:8]}"

    # 3 transactions of 5 records, the 3rd aborted: 15 data records and 3 markers.
    committed, aborted = load_transactional(secure_lab.bootstrap, topic, data.generate(15),
                                            partitions=1, txn_size=5, abort_every=3)
    view = describe_topic(secure_lab.bootstrap, topic)
    markers = [b.marker for b in view.batches if b.is_control]
    assert markers == ["COMMIT", "COMMIT", "ABORT"]
    assert sum(b.record_count for b in view.batches if not b.is_control) == 15
    assert (len(committed), len(aborted)) == (10, 5)
    assert view.partition(0).high_watermark == 18  # 15 records + 3 markers, each an offset

    # The CLI's `labkit inspect`, pointed at the secure lab: the same view, and without
    # LABKIT_KAFKA_CONFIG a message that names it.
    env = {**os.environ, settings.BOOTSTRAP: secure_lab.bootstrap, "LABKIT_NAMESPACE": ""}
    cli = [sys.executable, "-m", "labkit.cli", "inspect", topic, "--json"]
    shown = json.loads(subprocess.run(cli, env=env, capture_output=True, text=True,
                                      check=True, cwd=ROOT).stdout)
    (partition,) = shown["partitions"]
    assert [b["marker"] for b in partition["batches"] if b["is_control"]] == markers
    env.pop(settings.KAFKA_CONFIG)
    refused = subprocess.run(cli, env=env, capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode != 0
    assert "LABKIT_KAFKA_CONFIG" in refused.stderr and "Traceback" not in refused.stderr

    # The protocol connection itself: a wrong password is refused by the broker, by name.
    good = protocol.Security.for_address(secure_lab.bootstrap)
    wrong = protocol.Security(protocol=good.protocol, mechanism=good.mechanism,
                              username=good.username, password="not-the-password",
                              ca_location=good.ca_location)
    with pytest.raises(protocol.AuthenticationError, match="LABKIT_KAFKA_CONFIG"):
        protocol.Connection(secure_lab.bootstrap, security=wrong)


def test_a_share_groups_stored_state_on_the_secure_lab(secure_lab, monkeypatch, tmp_path):
    from labkit.kafka.inspect.client import InspectError, Inspector
    from labkit.kafka.inspect.share import share_state

    # ReadShareGroupState is ClusterAction-only: the learner is refused, the inspector asks
    # again as the secure lab's admin (found through LABKIT_HOME, the lab's home).
    monkeypatch.setenv("LABKIT_HOME", str(secure_lab.home))
    run = experiments.run("share-group", guarantee="at_least_once",
                          crash_at="after-process-before-ack", records=10,
                          cluster=secure_lab.bootstrap)
    assert (run.report.lost, run.report.duplicated) == (0, 1)
    state = run.share_state
    # Read from the broker: the group's start offset has moved into the input, and nothing
    # in [start, end) is left to deliver.
    assert 0 < state.start_offset <= state.end_offset == 10
    counts = state.counts()
    assert counts["available"] == 0 and counts["not recorded"] == 0
    # Without a lab to lend an admin (a room's cluster), the view says what it needs.
    monkeypatch.setenv("LABKIT_HOME", str(tmp_path))
    with Inspector(secure_lab.bootstrap) as inspector, \
            pytest.raises(InspectError, match="operator's credentials"):
        share_state(inspector, run.group, run.topics["input"])


def _audit(run: scenarios.ScenarioRun) -> tuple:
    r = run.report
    return r.produced, r.delivered_unique, r.lost, r.duplicated, r.verdict


def test_a_fault_through_the_proxy_audits_the_same_on_the_secure_lab(secure_lab, bootstrap,
                                                                      monkeypatch):
    # The proxy's clients (the scenario's worker processes) speak plaintext to it; it does
    # TLS and SCRAM upstream. The 1st Produce's ack is dropped: at_least_once retries it.
    secure = experiments.run("producer", guarantee="at_least_once",
                             fault="drop-ack:produce:1", records=40,
                             cluster=secure_lab.bootstrap)
    assert secure.fault_stats["responses_dropped"] == 1
    assert secure.fault_stats["protocol_errors"] == 0
    assert settings.current().plaintext == frozenset()  # the stopped proxy unmarked its ports
    with monkeypatch.context() as plain_env:
        plain_env.delenv(settings.KAFKA_CONFIG)
        plain = experiments.run("producer", guarantee="at_least_once",
                                fault="drop-ack:produce:1", records=40,
                                cluster=bootstrap)
    assert _audit(secure) == _audit(plain)
    assert secure.report.lost == 0 and secure.report.duplicated > 0


def test_torture_apps_on_the_secure_lab(secure_lab):
    # A Python app reads LABKIT_KAFKA_CONFIG itself; Kafka's copier (no option for client
    # properties) runs behind a proxy of its own; a fault puts the harness's proxy in front
    # of the Python app, whose side is then plaintext.
    python_app = harness.torture(PYTHON_APP, records=200, kills=2, seed=1, cluster=secure_lab)
    copier = harness.torture(COPIER, records=300, kills=1, seed=1, cluster=secure_lab)
    # No kill in the faulted run: a kill landing while the 3rd Produce is on its way takes the
    # app's connection down before the broker's answer reaches the proxy, so there is no
    # answer left to drop (CI saw responses_dropped 0 once). The other two runs kill.
    faulted = harness.torture(PYTHON_APP, records=100, kills=0, seed=1, cluster=secure_lab,
                              fault="drop-ack:produce:3")
    for result in (python_app, copier, faulted):
        r = result.report
        assert (r.produced, r.delivered_unique, r.lost, r.duplicated) == \
            (r.produced, r.produced, 0, 0), result.summary()
        assert result.verdict == "exactly once", result.summary()
    assert (python_app.kills, copier.kills, faulted.kills) == (2, 1, 0)
    assert faulted.fault_stats["responses_dropped"] == 1


@pytest.mark.spark
def test_a_spark_experiment_on_the_secure_lab(secure_lab):
    # Spark's Kafka source and recount (Java clients) get the kafka.-prefixed translation.

    run = experiments.run("spark-txn-input", cluster=secure_lab.bootstrap,
                          guarantee="exactly_once",
                          crash_at="spark-after-sink-before-commit",
                          records=20, spare=False)
    try:
        r = run.report
        assert run.run.crashed
        assert (r.produced, r.delivered_unique, r.lost, r.duplicated, r.aborted_visible) == \
            (15, 15, 0, 0, 0)
        assert r.verdict == "exactly once"
    finally:
        run.cleanup()
