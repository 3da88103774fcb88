"""The secure lab (`labkit up --secure`): a real SASL_SSL broker, SCRAM-SHA-512 users, ACLs on.

One secure broker for the module (its own LABKIT_HOME, stopped on every path). Judged by what
the broker does: a client with LABKIT_KAFKA_CONFIG produces, consumes and commits a
transaction; one without it, or with a wrong password, is refused and told what to set; the
learner user cannot do what its ACLs do not grant; notebooks 00, 04 and 05 pass nbval
against it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)

from labkit.kafka import cluster as lab
from labkit.kafka import connection, secure, topics
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import STATE_FILE, LocalCluster
from labkit.kafka.reach import AuthenticationFailed, check_reachable

ROOT = Path(__file__).resolve().parents[1]
FIX = "authentication failed: set LABKIT_KAFKA_CONFIG={} (labkit up --secure wrote it)"


@pytest.fixture(scope="module")
def secure_lab(tmp_path_factory: pytest.TempPathFactory):
    cluster = LocalCluster(brokers=1, home=tmp_path_factory.mktemp("secure"), secure=True)
    cluster.start()  # a failed start stops what it spawned
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def learner(secure_lab: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> LocalCluster:
    """This process as a learner of the secure lab: its home, its client.properties."""
    monkeypatch.setenv("LABKIT_HOME", str(secure_lab.home))
    monkeypatch.setenv("LABKIT_KAFKA_CONFIG", str(secure_lab.client_properties))
    monkeypatch.delenv("LABKIT_BOOTSTRAP", raising=False)
    return secure_lab


def _wrong_password(secure_lab: LocalCluster, where: Path) -> Path:
    props = connection.read_properties(secure_lab.client_properties)
    return connection.write_properties(where, {**props, "sasl.password": "not-the-password"})


def test_clients_with_the_config_produce_consume_and_transact(learner: LocalCluster) -> None:
    assert lab.ensure().bootstrap == learner.bootstrap  # attaches: the credentials work
    props = connection.read_properties(learner.client_properties)
    assert (props["security.protocol"], props["sasl.mechanism"], props["sasl.username"]) == \
        ("SASL_SSL", "SCRAM-SHA-512", "learner")
    state = json.loads((learner.home / STATE_FILE).read_text())
    assert state["secure"] is True and LocalCluster.attach(learner.home).secure

    topic = f"secure-{uuid.uuid4().hex[:8]}"
    topics.create(learner.bootstrap, topic)
    idempotent = Producer(client_config({"bootstrap.servers": learner.bootstrap,
                                         "enable.idempotence": True}))
    idempotent.produce(topic, topics.encode({"id": "plain"}))
    assert idempotent.flush(30) == 0
    txn = Producer(client_config({"bootstrap.servers": learner.bootstrap,
                                  "transactional.id": f"{topic}-txn"}))
    txn.init_transactions(30)
    for outcome in ("aborted", "committed"):
        txn.begin_transaction()
        txn.produce(topic, topics.encode({"id": outcome}))
        assert txn.flush(30) == 0  # in the log before the abort (librdkafka purges unsent ones)
        (txn.abort_transaction if outcome == "aborted" else txn.commit_transaction)(30)
    assert [r.value["id"] for r in topics.read(learner.bootstrap, topic)] == ["plain", "committed"]
    assert [r.value["id"] for r in topics.read(learner.bootstrap, topic,
                                               isolation="read_uncommitted")] == \
        ["plain", "aborted", "committed"]

    # a consumer group commits its offsets (the learner may use any group)
    group = Consumer(client_config({"bootstrap.servers": learner.bootstrap,
                                    "group.id": f"{topic}-group", "auto.offset.reset": "earliest",
                                    "enable.auto.commit": False}))
    try:
        group.subscribe([topic])
        got = []
        while len(got) < 2:
            got += [m for m in group.consume(10, timeout=10) if m.error() is None]
        group.commit(asynchronous=False)
        assert [topics.decode(m.value())["id"] for m in got] == ["plain", "committed"]
        committed = group.committed([TopicPartition(topic, 0)], timeout=30)
        assert committed[0].offset > got[-1].offset()  # stored by the broker, past what was read
    finally:
        group.close()


def test_each_broker_is_asked_for_a_new_topic_with_tls_and_scram(learner: LocalCluster) -> None:
    """topics.create asks each broker of a cluster of several for the new topic over the
    lab's own protocol connection; this lab has one broker, so it is asked here directly,
    as a secure cluster of three (LABKIT_BOOTSTRAP) would be: it answers with the learner's
    TLS and SCRAM settings, and a topic it does not have is waited for, not passed over."""
    topic = f"everywhere-{uuid.uuid4().hex[:8]}"
    topics.create(learner.bootstrap, topic, partitions=2)
    topics._wait_on_each_broker([learner.bootstrap], {topic: 2}, time.monotonic() + 10, 10)
    with pytest.raises(TimeoutError, match=f"{learner.bootstrap} does not show.*{topic}-never"):
        topics._wait_on_each_broker([learner.bootstrap], {f"{topic}-never": 1},
                                    time.monotonic() + 1, 1)


def test_no_or_wrong_credentials_are_refused_with_the_fix(
        learner: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fix = FIX.format(learner.client_properties)
    monkeypatch.delenv("LABKIT_KAFKA_CONFIG")
    with pytest.raises(AuthenticationFailed, match="LABKIT_KAFKA_CONFIG is not set") as none:
        lab.ensure()
    assert str(none.value).startswith(fix)
    # a plaintext client straight at the port: it connects, and is never answered
    with pytest.raises(AuthenticationFailed) as plain:
        check_reachable(learner.bootstrap, timeout_s=3)
    assert str(plain.value).startswith(fix) and "accepts connections" in str(plain.value)

    monkeypatch.setenv("LABKIT_KAFKA_CONFIG", str(_wrong_password(learner, tmp_path / "w.properties")))
    with pytest.raises(AuthenticationFailed) as wrong:
        lab.ensure()
    assert str(wrong.value).startswith(fix) and "invalid credentials" in str(wrong.value)
    # what a client the lab makes sees from the broker itself
    admin = AdminClient(client_config({"bootstrap.servers": learner.bootstrap}))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)


def test_doctor_names_wrong_credentials_and_passes_with_the_right_ones(
        learner: LocalCluster, tmp_path: Path) -> None:
    def doctor(config: Path) -> tuple[int, dict[str, dict]]:
        env = {**os.environ, "LABKIT_KAFKA_CONFIG": str(config)}
        out = subprocess.run([sys.executable, "-m", "labkit.cli", "doctor", "--json", "--no-spark"],
                             capture_output=True, text=True, env=env, timeout=300)
        return out.returncode, {c["name"]: c for c in json.loads(out.stdout)["checks"]}

    code, checks = doctor(_wrong_password(learner, tmp_path / "w.properties"))
    assert code == 1 and not checks["reachable"]["ok"]
    assert checks["reachable"]["detail"].startswith(FIX.format(learner.client_properties))
    assert checks["reachable"]["fix"] == f"export LABKIT_KAFKA_CONFIG={learner.client_properties}"
    code, checks = doctor(learner.client_properties)
    assert code == 0 and all(c["ok"] for c in checks.values()), checks
    assert checks["credentials"]["detail"].startswith("SASL_SSL SCRAM-SHA-512 as learner")
    assert {"reachable", "produce/consume", "transactions"} <= set(checks)


def test_acls_are_on_the_learner_gets_only_what_it_was_granted(learner: LocalCluster) -> None:
    as_learner = AdminClient(client_config({"bootstrap.servers": learner.bootstrap}))
    as_admin = AdminClient(client_config({"bootstrap.servers": learner.bootstrap,
                                          **secure.SecureLab(learner.home).admin_config()}))
    topic = f"forbidden-{uuid.uuid4().hex[:8]}"
    deny_read = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                           f"User:{secure.LEARNER}", "*", AclOperation.READ, AclPermissionType.DENY)
    # the learner may not change ACLs (no Alter on the cluster) ...
    with pytest.raises(KafkaException) as refused:
        as_learner.create_acls([deny_read])[deny_read].result(timeout=30)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # ... the admin (a super user) may, and the broker enforces it on the learner's reads
    as_admin.create_acls([deny_read])[deny_read].result(timeout=30)
    topics.create(learner.bootstrap, topic)
    producer = Producer(client_config({"bootstrap.servers": learner.bootstrap}))
    producer.produce(topic, topics.encode({"id": "x"}))
    assert producer.flush(30) == 0  # WRITE is still granted
    consumer = Consumer(client_config({"bootstrap.servers": learner.bootstrap,
                                       "group.id": f"{topic}-g", "auto.offset.reset": "earliest"}))
    try:
        consumer.subscribe([topic])
        errors = []
        for _ in range(20):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is not None:
                errors.append(msg.error().code())
                break
            assert msg is None or msg.error() is not None, "the learner read a denied topic"
        assert errors == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    finally:
        consumer.close()


def test_notebooks_00_04_05_pass_nbval_against_the_secure_lab(learner: LocalCluster) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_BOOTSTRAP"}
    notebooks = [f"notebooks/{n}" for n in ("00_tour.ipynb", "04_transactions.ipynb",
                                             "05_consume_transform_produce.ipynb")]
    out = subprocess.run([sys.executable, "-m", "pytest", *notebooks, "--nbval",
                          "--nbval-sanitize-with", "notebooks/sanitize.cfg", "-p", "no:cacheprovider",
                          "--shipped-notebooks",  # the solved runs are the main suite's
                          "-q", "--lab-home", str(learner.home)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    # they ran on this broker: their topics are there, seen with the learner's credentials
    names = AdminClient(client_config({"bootstrap.servers": learner.bootstrap})).list_topics(
        timeout=30).topics
    assert any(n.startswith("consume-transform-produce-") for n in names), sorted(names)


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=120)


def test_cli_up_and_status_say_the_lab_is_secure(cluster: lab.Cluster,
                                                 learner: LocalCluster) -> None:
    up = _cli("up", "--secure")  # the running secure lab is reused: its address, the export line
    assert up.returncode == 0, up.stderr
    assert up.stdout.splitlines() == [learner.bootstrap,
                                      f"export LABKIT_KAFKA_CONFIG={learner.client_properties}"]
    assert ("security: SASL_SSL only (SCRAM-SHA-512, TLS, ACLs on); clients need export "
            f"LABKIT_KAFKA_CONFIG={learner.client_properties}") in _cli("status").stdout
    info = json.loads(_cli("status", "--json").stdout)
    assert info["secure"] is True and info["client_properties"] == str(learner.client_properties)
    if cluster.external:
        return  # the session runs against LABKIT_BOOTSTRAP: no plaintext lab of ours below
    # the session's plaintext lab is never passed off as a secure one
    refused = _cli("up", "--secure", LABKIT_HOME=str(cluster.home))
    assert refused.returncode == 2 and "a plaintext lab is already running" in refused.stderr
    assert "security: plaintext" in _cli("status", LABKIT_HOME=str(cluster.home)).stdout


def test_client_properties_are_checked_by_name(tmp_path: Path) -> None:
    java = tmp_path / "java.properties"
    java.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
                    "sasl.jaas.config=org.apache.kafka...PlainLoginModule required;\n")
    with pytest.raises(connection.ConnectionConfigError,
                       match="sasl.jaas.config is a Java client name; librdkafka's is "
                             "sasl.username and sasl.password"):
        connection.settings(java)
    with pytest.raises(connection.ConnectionConfigError, match="no such file"):
        connection.settings(tmp_path / "missing.properties")


def test_a_handshake_cut_short_is_a_wait_not_refused_credentials() -> None:
    # librdkafka's words in CI (stop 64): a SASL handshake whose connection dropped under
    # load, taken for refused credentials, so a right loop got an error, not a verdict
    # (refused credentials are still refused: test_no_or_wrong_credentials_are_refused_with_the_fix)
    cut = ("_AUTHENTICATION sasl_ssl://127.0.0.1:22542/bootstrap: SASL authentication error: "
           "SaslAuthenticateRequest failed: Local: Broker transport failure (after 0ms in "
           "state DOWN)")
    timed_out = cut.replace("Broker transport failure", "Timed out")
    assert not secure.looks_like_auth_failure(cut)
    assert not secure.looks_like_auth_failure(timed_out)
