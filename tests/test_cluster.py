"""The lab's Kafka is a real broker: round trips, transactions, durability, replication."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata
from kio.schema.types import TopicName

from labkit.faults.proxy import FaultProxy
from labkit.kafka import topics
from labkit.kafka.protocol import Connection
from labkit.kafka.localcluster import LocalCluster
from labkit.kafka.reach import ClusterError
from labkit.proc import pid_alive
from tests.kafka_helpers import consume_all


def test_produced_record_is_consumed_back(bootstrap, topic_name):
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic_name, key=b"k", value=b"hello")
    assert producer.flush(10) == 0
    assert consume_all(bootstrap, topic_name, 1) == [b"hello"]


def test_idempotent_producer_round_trip(bootstrap, topic_name):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(20):
        producer.produce(topic_name, value=f"r{i}".encode())
    assert producer.flush(10) == 0
    assert consume_all(bootstrap, topic_name, 20) == [f"r{i}".encode() for i in range(20)]


def test_read_committed_sees_only_committed_transaction(bootstrap, topic_name):
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic_name, value=b"committed")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic_name, value=b"aborted")
    producer.flush(10)
    producer.abort_transaction(30)

    assert consume_all(bootstrap, topic_name, 1, "read_committed") == [b"committed"]
    assert sorted(consume_all(bootstrap, topic_name, 2, "read_uncommitted")) == [b"aborted", b"committed"]


def test_sigkill_and_restart_keeps_every_acknowledged_record(tmp_path):
    with LocalCluster(brokers=1, home=tmp_path) as cluster:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        acked: list[bytes] = []
        for i in range(500):
            producer.produce("durable", value=f"v{i}".encode(),
                             on_delivery=lambda err, msg: err is None and acked.append(msg.value()))
        assert producer.flush(20) == 0
        assert len(acked) == 500

        pid = cluster.brokers[0].pid
        cluster.kill()
        assert not pid_alive(pid)
        cluster.restart()
        assert cluster.brokers[0].pid != pid

        assert sorted(consume_all(cluster.bootstrap, "durable", 500)) == sorted(acked)


def leader_of(bootstrap: str, topic: str, partition: int = 0) -> int:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return md.topics[topic].partitions[partition].leader


CREATIONS = 12  # before the fix, 1 creation in 5 or more left a broker here not knowing


def shows_led(broker: Connection, topic: str, partitions: int) -> bool:
    """Whether this one broker's metadata has ``topic`` with all its partitions led."""
    response = broker.send(metadata.MetadataRequest(
        topics=(metadata.MetadataRequestTopic(topic_id=None, name=TopicName(topic)),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    (found,) = response.topics
    return (found.error_code == ErrorCode.none and len(found.partitions) == partitions
            and all(int(p.leader_id) >= 0 for p in found.partitions))


@pytest.mark.parametrize("through_proxy", [False, True], ids=["direct", "through-a-fault-proxy"])
def test_every_broker_knows_a_topic_as_soon_as_create_returns(three_brokers, through_proxy):
    """The controller acknowledges CreateTopics before each broker has the new metadata, and
    a client asks whichever broker it likes next: topics.create returns only once each of the
    three has the topic, also when the lab's clients reach them through a fault proxy (whose
    metadata names its own ports). Asked over connections opened beforehand, so the question
    comes within a millisecond or two of the return."""
    brokers = [Connection(b.address) for b in three_brokers.brokers]
    with contextlib.ExitStack() as stack:
        for broker in brokers:
            stack.enter_context(broker)
        bootstrap = (stack.enter_context(FaultProxy(three_brokers.bootstrap)).bootstrap
                     if through_proxy else three_brokers.bootstrap)
        for i in range(CREATIONS):
            topic = f"everywhere-{uuid.uuid4().hex[:8]}"
            topics.create(bootstrap, topic, partitions=3)
            unaware = [b.address for b in brokers if not shows_led(b, topic, 3)]
            assert not unaware, f"creation {i + 1}: {unaware} did not know {topic} yet"


def test_three_brokers_replicate_and_survive_leader_kill(three_brokers):
    cluster = three_brokers
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topics.create(cluster.bootstrap, "replicated", replication=3,
                  config={"min.insync.replicas": "2"})
    md = admin.list_topics("replicated", timeout=10).topics["replicated"]
    assert len(md.partitions[0].replicas) == 3

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "enable.idempotence": True})
    for i in range(100):
        producer.produce("replicated", value=f"before-{i}".encode())
    assert producer.flush(20) == 0

    old_leader = leader_of(cluster.bootstrap, "replicated")
    cluster.kill(old_leader)

    # Leadership moves to a surviving replica; acks=all writes (2 of 3 in sync) continue.
    deadline = time.monotonic() + 60
    new_leader = old_leader
    while time.monotonic() < deadline and new_leader in (old_leader, -1):
        time.sleep(0.5)
        try:
            new_leader = leader_of(cluster.bootstrap, "replicated")
        except KafkaException:
            continue
    assert new_leader not in (old_leader, -1)

    acked = []
    for i in range(100):
        producer.produce("replicated", value=f"after-{i}".encode(),
                         on_delivery=lambda err, msg: err is None and acked.append(msg.value()))
    assert producer.flush(60) == 0
    assert len(acked) == 100

    values = consume_all(cluster.bootstrap, "replicated", 200)
    assert sorted(values) == sorted([f"before-{i}".encode() for i in range(100)] + acked)
    cluster.restart(old_leader)


def test_waiting_for_a_topic_that_never_comes_is_a_clear_error(bootstrap):
    with pytest.raises(TimeoutError, match="never-created.*labkit status"):
        topics.wait_for_leaders(bootstrap, "never-created", timeout_s=1)


def test_unknown_broker_id_is_a_clear_error(three_brokers):
    with pytest.raises(ClusterError, match="no broker 7"):
        three_brokers.kill(7)


def test_cluster_ids_never_look_like_an_option():
    from labkit.kafka.brokerconfig import new_cluster_id
    ids = [new_cluster_id() for _ in range(3000)]  # ~1 in 64 raw ids starts with '-'
    assert not any(i.startswith("-") for i in ids)
    assert all(len(i) == 22 for i in ids)


def test_a_start_that_fails_half_way_leaves_no_broker_running(tmp_path, monkeypatch):
    # The broker JVM is really spawned; then waiting for it fails (as when a broker never
    # answers): the start must stop what it spawned, not leave an orphan JVM behind.
    def never_ready(self, timeout_s: float = 0.0):
        assert all(pid_alive(b.pid) for b in self.brokers)  # the JVM is up at this point
        raise ClusterError("broker did not answer (simulated at the wait)")

    monkeypatch.setattr(LocalCluster, "wait_ready", never_ready)
    lab = LocalCluster(brokers=1, home=tmp_path)
    with pytest.raises(ClusterError, match="did not answer"):
        lab.start()
    spawned = [b.pid for b in lab.brokers]
    assert spawned and all(pid for pid in spawned)
    assert not [pid for pid in spawned if pid_alive(pid)]
    assert LocalCluster.attach(tmp_path) is None
    assert not any(tmp_path.glob("node-*"))


def test_two_processes_starting_the_lab_at_once_share_one_broker(tmp_path):
    # Two kernels run cluster.ensure() at the same moment on a fresh lab home: one starts
    # the broker, the other waits for it and attaches (before the lock both started one in
    # the same directory).
    code = ("import sys; from labkit.kafka import cluster; c = cluster.ensure(); "
            "print(c.bootstrap, c.brokers[0].pid, flush=True); sys.stdin.read()")
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_BOOTSTRAP"}
    env["LABKIT_HOME"] = str(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=env) for _ in range(2)]
    try:
        seen = [p.stdout.readline().split() for p in procs]
        assert seen[0] and seen[0] == seen[1], seen
        broker_pid = int(seen[0][1])
        assert pid_alive(broker_pid)
    finally:
        for p in procs:  # the owner stops its broker at exit; the other only detaches
            p.stdin.close()
        for p in procs:
            p.wait(timeout=60)
    deadline = time.monotonic() + 20
    while pid_alive(broker_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pid_alive(broker_pid)
