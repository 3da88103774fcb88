"""The fault proxy against the real broker: it stays invisible without faults and does
exactly the one fault it is told to (a lost ack duplicates without idempotence, not with it)."""
from __future__ import annotations

import collections
import json
import socket
import threading
import time
import uuid
from typing import Callable

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, ElectionType, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.describe_cluster.v1.request import DescribeClusterRequest as DescribeClusterV1
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindCoordinatorV3
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest as FindCoordinatorV4
from kio.schema.metadata.v12.request import MetadataRequest as MetadataV12

from labkit.kafka import protocol, topics
from labkit.kafka.localcluster import LocalCluster
from labkit.faults.faultspec import VALID_FAULT_FORMS, FaultSpec, parse_fault_spec
from labkit.faults.proxy import FaultProxy

QUIET = {"log_level": 0}  # the faults make librdkafka log disconnects; they are the point


# --------------------------------------------------------------------------- helpers


def read_log(bootstrap: str, topic: str) -> list[str]:
    """Every value in the topic, read straight from the broker (never through a proxy)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        wanted = 0
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            wanted += high - low
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        values: list[str] = []
        deadline = time.monotonic() + 60
        while len(values) < wanted and time.monotonic() < deadline:
            for m in consumer.consume(1000, 1.0):
                if m.error() is None:
                    values.append(m.value().decode())
        return values
    finally:
        consumer.close()


def consume_group(bootstrap: str, topic: str, expected: int, **config) -> list[str]:
    """Values read by a subscribing consumer group (FindCoordinator, JoinGroup, commits)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", **QUIET, **config})
    consumer.subscribe([topic])
    values: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while len(values) < expected and time.monotonic() < deadline:
            for m in consumer.consume(1000, 1.0):
                if m.error() is None:
                    values.append(m.value().decode())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values


def committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return tp.offset
    finally:
        consumer.close()


def produce_one_by_one(bootstrap: str, topic: str, n: int, **config) -> list[tuple[str, object, int]]:
    """n records, each flushed before the next, so 'the Nth Produce' is the Nth record."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "retries": 5, "retry.backoff.ms": 100,
                         "max.in.flight.requests.per.connection": 1, **QUIET, **config})
    reports: list[tuple[str, object, int]] = []
    for i in range(n):
        producer.produce(topic, value=f"id-{i}",
                         on_delivery=lambda err, m: reports.append((m.value().decode(), err, m.offset())))
        assert producer.flush(30) == 0
    return reports


def find_coordinators(bootstrap: str, request):
    """FindCoordinator until the broker has its offsets topic ready (no error codes left)."""
    deadline = time.monotonic() + 30
    while True:
        with protocol.Connection(bootstrap.split(",")[0]) as conn:
            response = conn.send(request)
        entries = getattr(response, "coordinators", None) or (response,)
        if all(int(e.error_code) == 0 for e in entries) or time.monotonic() > deadline:
            return response
        time.sleep(0.5)


def proxy_ports(proxy: FaultProxy) -> set[int]:
    return {int(a.rsplit(":", 1)[1]) for a in proxy.bootstrap.split(",")}


# --------------------------------------------------------------------------- (5) fault specs


@pytest.mark.parametrize("text, expected", [
    ("drop-ack:produce:3", FaultSpec("drop-ack", "Produce", nth=3)),
    ("DROP-ACK:Produce", FaultSpec("drop-ack", "Produce", nth=1)),
    ("drop-response:offsetcommit:2", FaultSpec("drop-response", "OffsetCommit", nth=2)),
    ("drop-response:EndTxn:1", FaultSpec("drop-response", "EndTxn", nth=1)),
    ("delay:250", FaultSpec("delay", None, ms=250)),
    ("delay:40:fetch", FaultSpec("delay", "Fetch", ms=40)),
    ("reset:findcoordinator:2", FaultSpec("reset", "FindCoordinator", nth=2)),
])
def test_parse_fault_spec_accepts_the_documented_forms(text: str, expected: FaultSpec) -> None:
    assert parse_fault_spec(text) == expected


@pytest.mark.parametrize("text", [
    "", "drop", "drop-ack:fetch:1", "drop-ack:produce:0", "drop-response:nosuchapi:1",
    "delay:-5", "delay:soon", "reset", "reset:produce:1:2", "explode:produce:1",
])
def test_parse_fault_spec_rejects_bad_input_listing_valid_forms(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_fault_spec(text)
    message = str(info.value)
    for form in VALID_FAULT_FORMS:
        assert form in message
    assert "Produce" in message and "OffsetCommit" in message  # the valid API names


def test_proxy_rejects_a_bad_fault_before_starting() -> None:
    with pytest.raises(ValueError, match="drop-response:<api>:N"):
        FaultProxy("127.0.0.1:1", "drop-ack:metadata:1")


# --------------------------------------------------------------------------- addresses


def test_every_broker_address_a_client_learns_points_at_the_proxy(bootstrap: str) -> None:
    with FaultProxy(bootstrap) as proxy:
        ports = proxy_ports(proxy)
        assert bootstrap not in proxy.bootstrap
        with protocol.Connection(proxy.bootstrap.split(",")[0]) as conn:
            metadata = conn.send(MetadataV12(topics=None, include_topic_authorized_operations=False))
        old = find_coordinators(proxy.bootstrap, FindCoordinatorV3(key="some-group"))
        new = find_coordinators(proxy.bootstrap, FindCoordinatorV4(coordinator_keys=("group-a", "group-b")))
        assert {(b.host, int(b.port)) for b in metadata.brokers} == {("127.0.0.1", p) for p in ports}
        assert (old.host, int(old.port)) in {("127.0.0.1", p) for p in ports}
        assert len(new.coordinators) == 2
        assert {(c.host, int(c.port)) for c in new.coordinators} <= {("127.0.0.1", p) for p in ports}

        # Java admin clients (kafka-*.sh tools, Spark) ask DescribeCluster; librdkafka's
        # describe_cluster() asks Metadata instead, so send the request itself.
        with protocol.Connection(proxy.bootstrap.split(",")[0]) as conn:
            described = conn.send(DescribeClusterV1(include_cluster_authorized_operations=False))
        assert {(b.host, int(b.port)) for b in described.brokers} == {("127.0.0.1", p) for p in ports}
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap, **QUIET})
        cluster = admin.describe_cluster(request_timeout=10).result(30)
        assert {(n.host, n.port) for n in cluster.nodes} == {("127.0.0.1", p) for p in ports}
        assert proxy.stats()["protocol_errors"] == 0


def test_an_external_style_address_is_proxied_too(bootstrap: str) -> None:
    """A bootstrap given by host name (as LABKIT_BOOTSTRAP would be) works the same way."""
    host_form = ",".join(f"localhost:{a.rsplit(':', 1)[1]}" for a in bootstrap.split(","))
    with FaultProxy(host_form) as proxy:
        md = AdminClient({"bootstrap.servers": proxy.bootstrap, **QUIET}).list_topics(timeout=10)
        assert {(b.host, b.port) for b in md.brokers.values()} == {("127.0.0.1", p) for p in proxy_ports(proxy)}


def test_stop_leaves_no_thread_and_no_listening_port(bootstrap: str, topic_name: str) -> None:
    before = {t.ident for t in threading.enumerate()}
    proxy = FaultProxy(bootstrap).start()
    producer = Producer({"bootstrap.servers": proxy.bootstrap, **QUIET})
    producer.produce(topic_name, value="x")
    assert producer.flush(30) == 0  # a live client connection while we stop
    proxy.stop()
    assert {t.ident for t in threading.enumerate()} <= before
    for port in proxy_ports(proxy):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    proxy.stop()  # twice is harmless


# --------------------------------------------------------------------------- (1) soak


def test_soak_10000_records_with_random_delays_nothing_lost_nothing_duplicated(
        bootstrap: str, topic_name: str) -> None:
    topics.create(bootstrap, topic_name, partitions=3)
    n = 10_000
    with FaultProxy(bootstrap, seed=7) as proxy:
        proxy.delay(2, jitter_ms=15)
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 5,
                             "enable.idempotence": False, **QUIET})
        for i in range(n):
            producer.produce(topic_name, key=str(i % 97), value=f"id-{i:05d}-" + "x" * 80)
            producer.poll(0)
        assert producer.flush(60) == 0
        seen = consume_group(proxy.bootstrap, topic_name, n)
        stats = proxy.stats()
    counts = collections.Counter(v.split("-")[1] for v in seen)
    assert len(counts) == n, f"lost {n - len(counts)} records"
    assert max(counts.values()) == 1, f"duplicated: {[k for k, c in counts.items() if c > 1][:5]}"
    assert stats["requests_delayed"] > 0 and stats["requests"]["Produce"] > 0
    assert stats["responses_dropped"] == stats["connections_reset"] == stats["protocol_errors"] == 0


# --------------------------------------------------------------------------- (2)(3) lost ack


def test_a_lost_ack_with_retries_duplicates_without_idempotence(bootstrap: str, topic_name: str) -> None:
    topics.create(bootstrap, topic_name)
    with FaultProxy(bootstrap, "drop-ack:produce:3") as proxy:
        reports = produce_one_by_one(proxy.bootstrap, topic_name, 6, **{"enable.idempotence": False})
        stats = proxy.stats()
    assert [err for _, err, _ in reports] == [None] * 6  # the producer believes all went well
    assert stats["responses_dropped"] == 1
    log = collections.Counter(read_log(bootstrap, topic_name))
    assert log["id-2"] == 2, log  # the 3rd record: written, ack lost, retried, written again
    assert all(log[f"id-{i}"] == 1 for i in (0, 1, 3, 4, 5)), log


def test_a_lost_ack_is_deduplicated_by_the_idempotent_producer(bootstrap: str, topic_name: str) -> None:
    topics.create(bootstrap, topic_name)
    with FaultProxy(bootstrap, "drop-ack:produce:3") as proxy:
        reports = produce_one_by_one(proxy.bootstrap, topic_name, 6, **{"enable.idempotence": True})
        stats = proxy.stats()
    assert [err for _, err, _ in reports] == [None] * 6
    assert [offset for *_, offset in reports] == list(range(6))  # the retry got the original offset
    assert stats["responses_dropped"] == 1
    assert stats["requests"]["Produce"] == 7  # six records and the retry the broker deduplicated
    assert collections.Counter(read_log(bootstrap, topic_name)) == {f"id-{i}": 1 for i in range(6)}


def test_a_forged_error_is_traced_as_the_client_read_it(bootstrap: str, topic_name: str) -> None:
    """The trace (a run's history) says what the client was told: the proxy's error, marked
    as the proxy's, not the broker's success it replaced."""
    topics.create(bootstrap, topic_name)
    traced: list[dict] = []
    with FaultProxy(bootstrap, "error:produce:2:NOT_ENOUGH_REPLICAS", trace=traced.append,
                    trace_apis={"Produce"}) as proxy:
        reports = produce_one_by_one(proxy.bootstrap, topic_name, 3, **{"enable.idempotence": True})
    assert [err for _, err, _ in reports] == [None] * 3  # a retriable error: retried, written
    produces = [e for e in traced if e["api"] == "Produce"]
    assert [(e["error"], e.get("forged", False)) for e in produces] == [
        (None, False), ("NOT_ENOUGH_REPLICAS", True), (None, False), (None, False)], produces


def test_reset_cuts_the_connection_before_the_broker_sees_the_request(
        bootstrap: str, topic_name: str) -> None:
    topics.create(bootstrap, topic_name)
    with FaultProxy(bootstrap, "reset:produce:2") as proxy:
        reports = produce_one_by_one(proxy.bootstrap, topic_name, 4, **{"enable.idempotence": False})
        stats = proxy.stats()
    assert [err for _, err, _ in reports] == [None] * 4
    assert stats["connections_reset"] == 1
    # Unlike a lost ack, the retry does not duplicate: the first attempt never got through.
    assert collections.Counter(read_log(bootstrap, topic_name)) == {f"id-{i}": 1 for i in range(4)}


def test_acks_0_produce_is_never_waited_for(bootstrap: str, topic_name: str) -> None:
    topics.create(bootstrap, topic_name)
    with FaultProxy(bootstrap) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": 0, "linger.ms": 0, **QUIET})
        for i in range(300):
            producer.produce(topic_name, value=f"id-{i}")
            producer.poll(0)
        assert producer.flush(30) == 0
        producer.list_topics(topic_name, timeout=10)  # a request answered behind the silent ones
        stats = proxy.stats()
    assert stats["protocol_errors"] == 0 and stats["connections_reset"] == 0
    deadline = time.monotonic() + 10
    while len(values := read_log(bootstrap, topic_name)) < 300 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sorted(values) == sorted(f"id-{i}" for i in range(300))


# --------------------------------------------------------------------------- (4) groups, transactions


def test_consumer_group_and_transactional_producer_work_through_the_proxy(
        bootstrap: str, topic_name: str) -> None:
    topics.create(bootstrap, topic_name)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with FaultProxy(bootstrap) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap,
                             "transactional.id": f"tx-{uuid.uuid4().hex[:8]}", **QUIET})
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(50):
            producer.produce(topic_name, value=f"kept-{i}")
        producer.commit_transaction(30)
        producer.begin_transaction()
        for i in range(20):
            producer.produce(topic_name, value=f"aborted-{i}")
        # librdkafka purges unsent messages on abort: flush so the aborted ones reach the log.
        assert producer.flush(30) == 0
        producer.abort_transaction(30)

        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group,
                             "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                             "enable.auto.commit": False, **QUIET})
        consumer.subscribe([topic_name])
        values: list[str] = []
        deadline = time.monotonic() + 60
        while len(values) < 50 and time.monotonic() < deadline:
            values += [m.value().decode() for m in consumer.consume(100, 1.0) if m.error() is None]
        values += [m.value().decode() for m in consumer.consume(100, 2.0) if m.error() is None]
        consumer.commit(asynchronous=False)
        consumer.close()
        stats = proxy.stats()["requests"]

    assert values == [f"kept-{i}" for i in range(50)]
    # Coordinator traffic went through the proxy: the rewritten FindCoordinator kept it there.
    for api in ("FindCoordinator", "InitProducerId", "AddPartitionsToTxn", "EndTxn",
                "JoinGroup", "SyncGroup", "OffsetCommit"):
        assert stats.get(api, 0) >= 1, (api, stats)
    # 50 records, 1 COMMIT marker, 20 aborted records, 1 ABORT marker: the committed offset
    # (read directly from the broker) is past all of them.
    assert committed(bootstrap, group, topic_name) == 72


# --------------------------------------------------------------------------- (6) three brokers


def test_three_broker_metadata_lists_only_proxy_addresses(three_brokers: LocalCluster) -> None:
    topic = f"t3-{uuid.uuid4().hex[:8]}"
    topics.create(three_brokers.bootstrap, topic, partitions=6, replication=3)
    real = {b.address for b in three_brokers.brokers}
    with FaultProxy(three_brokers.bootstrap) as proxy:
        ports = proxy_ports(proxy)
        assert len(ports) == 3
        md = AdminClient({"bootstrap.servers": proxy.bootstrap, **QUIET}).list_topics(timeout=10)
        addresses = {f"{b.host}:{b.port}" for b in md.brokers.values()}
        assert addresses == {f"127.0.0.1:{p}" for p in ports}
        assert not addresses & real
        # Leaders are spread over the three brokers: records reach all of them via the proxy.
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", **QUIET})
        for i in range(600):
            producer.produce(topic, key=str(i), value=f"id-{i}")
        assert producer.flush(60) == 0
        seen = consume_group(proxy.bootstrap, topic, 600)
        stats = proxy.stats()
    assert sorted(seen) == sorted(f"id-{i}" for i in range(600))
    assert stats["protocol_errors"] == 0


def test_three_broker_cluster_reached_only_through_the_proxy(three_brokers: LocalCluster) -> None:
    """Coordinators live on various brokers; none of them may be reached directly."""
    with FaultProxy(three_brokers.bootstrap) as proxy:
        ports = proxy_ports(proxy)
        keys = tuple(f"group-{i}" for i in range(12))  # hashed onto the 5 offsets partitions
        found = find_coordinators(proxy.bootstrap, FindCoordinatorV4(coordinator_keys=keys))
        assert {(c.host, int(c.port)) for c in found.coordinators} <= {("127.0.0.1", p) for p in ports}
        assert len({int(c.node_id) for c in found.coordinators}) > 1  # several brokers behind it


def _in_sync(admin: AdminClient, topic: str, node_id: int, timeout_s: float = 60.0) -> None:
    """Wait until ``node_id`` is back in partition 0's in-sync replicas (it may lead again)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        isr = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].isrs
        if node_id in isr:
            return
        time.sleep(0.2)
    raise AssertionError(f"broker {node_id} did not rejoin {topic}-0's in-sync replicas in {timeout_s:.0f} s")


def test_three_brokers_leader_moves_and_the_producer_still_only_knows_proxy_addresses(
        three_brokers: LocalCluster) -> None:
    """Leadership moves while the old leader still answers: its Produce responses carry the
    new leader's address (KIP-951), which the proxy must rewrite too.

    A controlled shutdown moves it first; whether the producer has a request in flight at that
    moment is timing. So the restarted broker is then elected leader again while the one the
    producer knows stays up: its next Produce surely gets NOT_LEADER with the new leader."""
    topic = f"t3-{uuid.uuid4().hex[:8]}"
    topics.create(three_brokers.bootstrap, topic, partitions=3, replication=3)
    client_view: dict = {}
    errors: list = []
    with FaultProxy(three_brokers.bootstrap) as proxy:
        # Idempotent, so retries around the moves cannot blur the count below.
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True,
                             "linger.ms": 5, "statistics.interval.ms": 200, **QUIET,
                             "stats_cb": lambda s: client_view.update(json.loads(s))})
        leader = producer.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
        stopper = threading.Thread(target=three_brokers.stop_broker, args=(leader,))
        sent = 0

        def send_until(done: Callable[[], bool], within_s: float) -> None:
            nonlocal sent
            deadline = time.monotonic() + within_s
            while not done() and time.monotonic() < deadline:
                try:
                    producer.produce(topic, value=f"id-{sent}", partition=sent % 3,
                                     on_delivery=lambda err, m: err and errors.append(err))
                except BufferError:  # the client's queue is full while leadership moves: wait
                    producer.poll(0.05)
                    continue
                sent += 1
                producer.poll(0.0005)

        def produce_rewritten() -> bool:
            return "Produce" in proxy.stats()["responses_rewritten"]

        try:
            send_until(lambda: sent >= 2000, 30)
            stopper.start()
            send_until(lambda: not stopper.is_alive(), 60)
            stopper.join()
            if not produce_rewritten():
                three_brokers.restart(leader)
                admin = AdminClient({"bootstrap.servers": three_brokers.bootstrap, **QUIET})
                _in_sync(admin, topic, leader)
                partition = TopicPartition(topic, 0)
                elected = admin.elect_leaders(ElectionType.PREFERRED, [partition]).result(timeout=30)
                assert elected[partition] is None, elected  # the first replica (the old leader) leads again
                send_until(produce_rewritten, 30)
            assert producer.flush(60) == 0
            producer.poll(0.5)  # one more statistics callback
            stats = proxy.stats()
        finally:
            if stopper.is_alive():
                stopper.join()
            three_brokers.restart(leader)
    assert errors == []
    assert stats["responses_rewritten"].get("Produce", 0) >= 1, stats
    known = {b["nodename"] for b in client_view["brokers"].values() if b["nodeid"] >= 0}
    assert known <= {f"127.0.0.1:{p}" for p in proxy_ports(proxy)}, known
    assert collections.Counter(read_log(three_brokers.bootstrap, topic)) == {f"id-{i}": 1 for i in range(sent)}
