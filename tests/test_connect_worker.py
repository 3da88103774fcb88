"""The Kafka Connect worker the lab starts (labkit.kafka.connect): a real JVM of Kafka 4.4's
connect-runtime with Debezium on its plugin path, its topics on the lab's cluster, its REST
API on loopback; what it refuses, and that nothing of it is left after."""
from __future__ import annotations

import time
import uuid

import pytest

from labkit.kafka import connect, topics
from labkit.kafka.connect import ConnectWorker, WorkerNames, worker_properties
from labkit.kafka.connectrest import ConnectError, ConnectRest
from labkit.pipelines import data, outbox
from labkit.storage import postgres
from labkit.storage.debezium import CONNECTOR_CLASS, DebeziumError, OutboxSource


def test_a_worker_streams_the_outbox_written_after_prepare_and_refuses_what_it_cannot_do(
        bootstrap, pg_dsn, tmp_path):
    run = uuid.uuid4().hex[:8]
    worker = ConnectWorker(bootstrap, f"connect-{run}", home=tmp_path)
    try:
        worker.start()
        check_the_worker(worker, bootstrap)
        streams_the_rows_written_after_prepare(worker, bootstrap, pg_dsn, run)
        worker.kill()
        assert not worker.alive
        with pytest.raises(ConnectError, match="no Connect worker answers"):
            ConnectRest(worker.url, timeout_s=2).connectors()
    finally:
        worker.stop()
        topics.delete(bootstrap, worker.names.configs, worker.names.offsets,
                      worker.names.statuses, f"events-{run}")
    assert connect.workers_left(tmp_path) == []


def check_the_worker(worker: ConnectWorker, bootstrap: str) -> None:
    """Healthy on loopback, Debezium on its plugin path, its topics on the cluster, and an
    exactly-once connector refused in Connect's words."""
    assert worker.rest.healthy() and worker.url.startswith("http://127.0.0.1:")
    assert worker.startup_s is not None and worker.startup_s < connect.READY_TIMEOUT_S
    assert CONNECTOR_CLASS in worker.rest.plugins()  # found on its plugin.path
    # its three topics, on the lab's cluster, under the names the lab gave them
    assert {worker.names.configs, worker.names.offsets, worker.names.statuses} <= \
        set(topics.listing(bootstrap))
    # KIP-618: a connector that requires exactly-once is refused by an at-least-once worker
    source = OutboxSource.named("refused", "postgresql://u@127.0.0.1:1/db", topic="x")
    with pytest.raises(ConnectError, match="exactly.once.support: This worker does not have "
                       "exactly-once source support enabled"):
        worker.rest.create(source.name, source.connector_config(exactly_once=True))
    assert worker.rest.connectors() == []


def streams_the_rows_written_after_prepare(worker: ConnectWorker, bootstrap: str, dsn: str,
                                           run: str) -> None:
    """The slot made by prepare() holds its place: outbox rows committed after it reach the
    topic even when the connector starts later; rows from before it never do."""
    table, payments = f"outbox_{run}", f"payments_{run}"
    source = OutboxSource.named(f"o-{run}", dsn, topic=f"events-{run}", table=table)
    topics.create(bootstrap, source.topic)
    outbox.create_tables(dsn, payments, table)
    try:
        outbox.write(dsn, data.generate(30, prefix="before"), table=payments, outbox=table)
        source.prepare()
        after = data.generate(50, prefix="after")
        outbox.write(dsn, after, table=payments, outbox=table)
        worker.rest.create(source.name, source.connector_config())
        worker.rest.wait_running(source.name)
        deadline = time.monotonic() + 60
        while len(seen := topics.read(bootstrap, source.topic)) < len(after) \
                and time.monotonic() < deadline:
            time.sleep(0.3)
        time.sleep(1)  # nothing more comes (the 30 from before prepare() would)
        assert [r.value["id"] for r in topics.read(bootstrap, source.topic)] == \
            [r["id"] for r in after]
        assert seen and all(r.key == r.value["key"] for r in seen)
    finally:
        worker.rest.delete(source.name)
        source.drop()


def test_worker_properties_name_its_topics_and_pass_credentials_to_its_tasks(monkeypatch, tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                      "sasl.username=alice\nsasl.password=secret\n")
    monkeypatch.setenv("LABKIT_KAFKA_CONFIG", str(config))
    monkeypatch.setenv("LABKIT_NAMESPACE", "alice")
    names = WorkerNames.of("connect")
    assert (names.group, names.offsets) == ("alice.connect", "alice.connect-offsets")
    assert names.task_transactional_id("outbox") == "alice.connect-outbox-0"
    props = worker_properties("127.0.0.1:9092", names, 28083, exactly_once=True,
                              commit_interval_ms=5000)
    assert props["exactly.once.source.support"] == "enabled"
    assert props["offset.flush.interval.ms"] == "5000"
    assert props["listeners"] == "http://127.0.0.1:28083"
    for prefix in ("", "producer.", "consumer.", "admin."):  # the tasks' clients too
        assert props[prefix + "security.protocol"] == "SASL_SSL"
        assert 'username="alice"' in props[prefix + "sasl.jaas.config"]


def test_a_database_without_logical_wal_is_refused_with_what_to_do(tmp_path):
    # a server of the test's own: the shared one runs with wal_level=logical
    server = postgres.LabPostgres(tmp_path, server_settings={"wal_level": "replica"}).start()
    try:
        source = OutboxSource.named(f"o-{uuid.uuid4().hex[:6]}", server.dsn(), topic="x")
        with pytest.raises(DebeziumError, match="runs with wal_level=replica.*wal_level=logical"):
            source.prepare()
    finally:
        server.stop()
    assert not server.running
