"""Where Kafka keeps a group's or a transaction's coordinator, and finding it on a cluster.

    transaction_coordinator(lab, "fees-1")     # the broker leading its __transaction_state partition
    group_coordinated_by(lab, 2, "copy")        # a group id whose coordinator is broker 2
    transactional_id_away_from(lab, 2, "copy")  # one broker 2 neither coordinates nor prefers

A coordinator is the leader of one partition of an internal topic: ``__consumer_offsets``
for a group, ``__transaction_state`` for a transactional.id, the partition being abs(Java
hashCode of the id) % partitions. Killing that leader moves the coordinator to the first
in-sync replica, in replica order, that the controller elects.
"""
from __future__ import annotations

import contextlib

from confluent_kafka import Consumer, ElectionType, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from labkit.kafka import names
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import LocalCluster
from labkit.kafka.inspect import InspectError, Inspector, ReplicaState, UnknownTopicError
from labkit.kafka.inspect.share import java_string_hash
from labkit.progress import wait_until

TRANSACTION_STATE = "__transaction_state"
CONSUMER_OFFSETS = "__consumer_offsets"


def group_coordinated_by(lab: LocalCluster, broker: int, prefix: str) -> str:
    """A consumer group id starting with ``prefix`` whose coordinator is ``broker``: the
    leader of its ``__consumer_offsets`` partition (Kafka: abs(Java hashCode of the id) %
    partitions). The topic is created by the first FindCoordinator, asked here."""
    probe = Consumer(client_config({"bootstrap.servers": lab.bootstrap,
                                    "group.id": f"{prefix}-probe", "log_level": 2}))
    try:
        with contextlib.suppress(KafkaException):  # no committed offset: only the lookup matters
            probe.committed([TopicPartition(CONSUMER_OFFSETS, 0)], timeout=30)
    finally:
        probe.close()
    found = _led_by_preferred_replicas(lab, CONSUMER_OFFSETS, broker)
    for n in range(1000):
        group = f"{prefix}-{n}"
        if found[_partition_of(names.group(group), len(found))].leader == broker:
            return group
    raise RuntimeError(f"no __consumer_offsets partition is led by broker {broker}")


def transactional_id_away_from(lab: LocalCluster, broker: int, prefix: str) -> str:
    """A transactional.id starting with ``prefix`` that ``broker`` neither coordinates nor
    will coordinate: its ``__transaction_state`` partition is led by, and prefers, another
    broker. A test that stops ``broker`` to move some other coordinator needs one; else the
    transaction's coordinator moves too (and back, when the controller's leader rebalancing
    gives the partition to its preferred replica again: "Coordinator load in progress")."""
    Producer(client_config({"bootstrap.servers": lab.bootstrap,  # creates the topic
                            "transactional.id": f"{prefix}-probe",
                            "log_level": 2})).init_transactions(60)
    found = _led_by_preferred_replicas(lab, TRANSACTION_STATE, broker)
    for n in range(1000):
        transactional_id = f"{prefix}-{n}"
        state = found[_partition_of(names.transactional_id(transactional_id), len(found))]
        if broker not in (state.leader, state.replicas[0]):
            return transactional_id
    raise RuntimeError(f"every __transaction_state partition is led or preferred by {broker}")


def _led_by_preferred_replicas(lab: LocalCluster, internal_topic: str,
                               ask: int) -> list[ReplicaState]:
    """``internal_topic``'s partitions, each given back to its preferred leader first
    (earlier runs' kills moved them to the brokers that survived), so every broker leads
    some; ``ask``: the broker to ask."""
    address = lab.broker(ask).address
    found: list[ReplicaState] = []

    def preferred() -> bool:
        try:
            with Inspector(address, timeout_s=5) as inspector:
                found[:] = inspector.replica_states(internal_topic, at=address)
        except (InspectError, UnknownTopicError, OSError):  # not created yet
            return False
        return bool(found) and all(p.leader == p.replicas[0] for p in found)

    if not preferred():
        admin = AdminClient(client_config({"bootstrap.servers": lab.bootstrap, "log_level": 2}))
        with contextlib.suppress(KafkaException):  # ELECTION_NOT_NEEDED and the like
            admin.elect_leaders(ElectionType.PREFERRED, [
                TopicPartition(internal_topic, p) for p in range(len(found) or 1)]).result(30)
        wait_until(preferred, f"{internal_topic} led by its preferred replicas", 60)
    return found


def _partition_of(broker_side_id: str, partitions: int) -> int:
    """Kafka's coordinator partition for a group or transactional id, as the broker sees it."""
    return java_abs(java_string_hash(broker_side_id)) % partitions


def next_coordinator(lab: LocalCluster, transactional_id: str, current: int) -> int:
    """The broker that will coordinate ``transactional_id`` once ``current`` dies: the
    controller elects the first in-sync replica, in replica order, of its partition."""
    _, state = transaction_state_partition(lab, transactional_id, ask=current)
    return next(r for r in state.replicas if r != current and r in state.isr)


def transaction_state_partition(lab: LocalCluster, transactional_id: str,
                                ask: int | None = None) -> tuple[int, ReplicaState]:
    """The ``__transaction_state`` partition that keeps ``transactional_id`` (Kafka: abs(Java
    hashCode of the id) % partitions) and its replicas; its leader is the coordinator.
    Returned once every replica is in sync again (a broker restarted moments ago catches
    up first): the controller elects from the ISR as it is when the leader dies.
    ``ask``: the broker to ask (default: the first one)."""
    address = lab.broker(ask or lab.brokers[0].node_id).address
    found: list[ReplicaState] = []

    def in_sync() -> bool:
        try:
            with Inspector(address, timeout_s=5) as inspector:
                states = inspector.replica_states(TRANSACTION_STATE, at=address)
        except OSError:  # that broker is still starting
            return False
        found[:] = [states[_partition_of(names.transactional_id(transactional_id), len(states))]]
        return set(found[0].isr) == set(found[0].replicas)

    wait_until(in_sync, f"every replica of the partition of {transactional_id} in sync", 60)
    return found[0].partition, found[0]


def kill_coordinator(lab: LocalCluster, transactional_id: str) -> tuple[int, int]:
    """SIGKILL the broker coordinating ``transactional_id``; return it and the broker that
    coordinates the id next. The killed broker is started again before this returns."""
    lab.restart()
    producer = Producer(client_config({"bootstrap.servers": lab.bootstrap,
                                       "transactional.id": transactional_id,
                                       "log_level": 2}))  # quiet about the broker killed
    producer.init_transactions(60)  # the coordinator knows the id from here on
    transaction_state_partition(lab, transactional_id)  # the ISR whole again before the kill
    first = transaction_coordinator(lab, transactional_id)
    lab.kill(first)
    try:
        return first, transaction_coordinator(lab, transactional_id, not_on=first)
    finally:
        lab.restart(first)


def java_abs(n: int) -> int:
    """Kafka's Utils.abs: Math.abs, with Integer.MIN_VALUE mapped to 0."""
    return 0 if n == -(1 << 31) else abs(n)


def transaction_coordinator(lab: LocalCluster, transactional_id: str,
                            not_on: int | None = None) -> int:
    """The broker coordinating ``transactional_id`` (FindCoordinator), once it is not
    ``not_on`` (a killed coordinator is replaced after the controller noticed)."""
    by_address = {b.address: b.node_id for b in lab.brokers}
    found: list[int] = []

    def located() -> bool:
        for b in lab.brokers:
            if b.node_id == not_on:
                continue
            try:
                with Inspector(b.address, timeout_s=5) as inspector:
                    address = inspector.transaction_coordinator(transactional_id)
            except OSError:
                continue
            if by_address.get(address) not in (None, not_on):
                found.append(by_address[address])
                return True
            return False
        return False

    wait_until(located, f"the coordinator of {transactional_id}", 30)
    return found[0]
