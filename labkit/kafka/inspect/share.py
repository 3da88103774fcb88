"""A share group's view of one partition (KIP-932), as the share coordinator stores it.

    with Inspector(bootstrap) as inspector:
        state = share_state(inspector, "orders-workers", "orders")
    state.counts()      # {'acknowledged': 38, 'archived': 1, 'available': 0, 'not recorded': 1}
    print(state.to_text())

ReadShareGroupState (api 84) asked straight at the share coordinator: the partition's
*start offset* (everything below it is done with), then state batches above it, each a
range of offsets with a delivery state (0 available, 2 acknowledged, 4 archived) and the
delivery count. An offset in [start, end) that no batch covers is "not recorded": never
delivered yet, or acquired by a consumer right now. Acquisition (in-flight records and
their locks) lives only in the partition leader's memory and is not persisted, so no
request shows it; a record released by a crash shows up as available with its count.

Why not FindCoordinator: the broker answers INVALID_REQUEST to key type 2 (share) from a
client, so the coordinator is found as the broker does: the leader of partition
abs(hash("group:topicId:partition")) mod N of ``__share_group_state`` (the topic id in
Kafka's base64 form); should that miss, the other brokers are asked.
"""
from __future__ import annotations

import base64
import json
import uuid
from dataclasses import asdict, dataclass

from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata
from kio.schema.read_share_group_state.v0 import request as read_state
from kio.schema.types import TopicName
from kio.static.primitive import i32

from labkit.kafka import names
from labkit.kafka.inspect.client import InspectError, Inspector, UnknownTopicError

STATE_TOPIC = "__share_group_state"
DELIVERY_STATES = {0: "available", 2: "acknowledged", 4: "archived"}
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class ShareBatch:
    first_offset: int
    last_offset: int
    state: str  # available | acknowledged | archived
    delivery_count: int


@dataclass(frozen=True)
class ShareState:
    """One share-partition: its start offset, the log's end, and the stored state batches."""

    group: str
    topic: str
    partition: int
    start_offset: int  # -1: the group has not started on this partition
    end_offset: int  # the high watermark
    state_epoch: int
    batches: tuple[ShareBatch, ...]

    def offsets(self) -> dict[int, tuple[str, int]]:
        """offset -> (state, delivery count) for every offset in [start, end)."""
        start = max(self.start_offset, 0)
        out = {o: (NOT_RECORDED, 0) for o in range(start, self.end_offset)}
        for b in self.batches:
            for o in range(max(b.first_offset, start), b.last_offset + 1):
                out[o] = (b.state, b.delivery_count)
        return out

    def counts(self) -> dict[str, int]:
        """How many offsets above the start offset are in each state; below it: 'done'."""
        out = {"done": max(self.start_offset, 0), "acknowledged": 0, "archived": 0,
               "available": 0, NOT_RECORDED: 0}
        for state, _ in self.offsets().values():
            out[state] += 1
        return out

    def delivery_counts(self) -> dict[int, int]:
        """Stored records per delivery count (records with state above the start offset)."""
        out: dict[int, int] = {}
        for state, count in self.offsets().values():
            if state != NOT_RECORDED:
                out[count] = out.get(count, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict:
        return {**asdict(self), "counts": self.counts()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def to_text(self) -> str:
        """One line for the partition, one per state batch (stable text for notebooks)."""
        counts = ", ".join(f"{k}={v}" for k, v in self.counts().items())
        lines = [f"share group {self.group} on {self.topic}-{self.partition}: start offset "
                 f"{self.start_offset}, end {self.end_offset}: {counts}"]
        lines += [f"  offsets {b.first_offset}-{b.last_offset}: {b.state}, delivered "
                  f"{b.delivery_count}x" for b in self.batches]
        return "\n".join(lines)


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (UTF-16 code units, 32-bit wrap-around): the broker's key hash."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def kafka_uuid(value: uuid.UUID) -> str:
    """A topic id as Kafka writes it (Uuid.toString: URL-safe base64, no padding)."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def _topic(inspector: Inspector, topic: str):
    request = metadata.MetadataRequest(
        topics=(metadata.MetadataRequestTopic(topic_id=None, name=TopicName(topic)),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    response = inspector._send(inspector._any_broker(), request)
    brokers = {int(b.node_id): f"{b.host}:{int(b.port)}" for b in response.brokers}
    (found,) = response.topics
    if found.error_code == ErrorCode.unknown_topic_or_partition:
        raise UnknownTopicError(topic, inspector.bootstrap)
    if found.error_code != ErrorCode.none:
        raise InspectError(f"Metadata for {topic!r}: {ErrorCode(found.error_code).name}")
    return found, brokers


def share_coordinator(inspector: Inspector, group: str, topic_id: uuid.UUID, partition: int) -> str:
    """The address of the broker holding this share-partition's state."""
    state_topic, brokers = _topic(inspector, STATE_TOPIC)
    n = len(state_topic.partitions)
    h = java_string_hash(f"{group}:{kafka_uuid(topic_id)}:{partition}")
    index = 0 if h == -(1 << 31) else abs(h) % n  # Kafka's Utils.abs
    leader = {int(p.partition_index): int(p.leader_id) for p in state_topic.partitions}[index]
    if leader not in brokers:
        raise InspectError(f"{STATE_TOPIC} partition {index} has no leader right now; try again")
    return brokers[leader]


def _read_state(inspector: Inspector, address: str, request) -> tuple:
    """The partitions of a ReadShareGroupState answer from ``address``.

    Kafka serves it to ClusterAction only (an inter-broker API), which a learner on a secure
    cluster is not granted: refused so, it is asked again as the local secure lab's admin
    (``labkit.kafka.secure.operator_properties``), the one identity the lab can lend; without one
    the error says what the view needs."""
    (result,) = inspector._send(address, request).results
    if result.partitions[0].error_code != ErrorCode.cluster_authorization_failed:
        return result.partitions
    from labkit.kafka import secure
    from labkit.paths import lab_home
    from labkit.kafka.protocol import Connection, Security

    operator = secure.operator_properties(lab_home())
    if operator is None:
        raise InspectError(
            "a share group's stored state is read with ReadShareGroupState, which Kafka serves "
            "to ClusterAction only (an inter-broker API) and your user is not granted it: on a "
            "room's cluster this view needs the operator's credentials")
    with Connection(address, inspector.timeout_s, security=Security.from_properties(operator)) \
            as conn:
        return conn.send(request).results[0].partitions


def share_state(inspector: Inspector, group: str, topic: str, partition: int = 0) -> ShareState:
    """What the share coordinator stores for ``group`` on ``topic``-``partition``.

    ``group`` and ``topic``: a learner's names or the broker's (``labkit.kafka.names``).
    A group that has not read the partition yet (or a cluster without the state topic yet)
    gives start offset -1 and no batches."""
    group, topic = names.group(group), names.topic(topic)
    found, _ = _topic(inspector, topic)
    epochs = {int(p.partition_index): int(p.leader_epoch) for p in found.partitions}
    if partition not in epochs:
        raise ValueError(f"{topic!r} has partitions {sorted(epochs)}, not {partition}")
    end = inspector.offsets(topic, [partition])[partition].high_watermark
    try:
        address = share_coordinator(inspector, group, found.topic_id, partition)
    except UnknownTopicError:
        return ShareState(group, topic, partition, -1, end, 0, ())
    # The partition's current leader epoch: a read with an older one is refused
    # (FENCED_LEADER_EPOCH), a newer one would fence the real share-partition leader.
    request = read_state.ReadShareGroupStateRequest(group_id=group, topics=(
        read_state.ReadStateData(topic_id=found.topic_id, partitions=(
            read_state.PartitionData(partition=i32(partition),
                                     leader_epoch=i32(epochs[partition])),)),))
    (p,) = _read_state(inspector, address, request)
    if p.error_code == ErrorCode.not_coordinator:  # moved since, or a hash we got wrong
        for other in inspector.brokers().values():
            if other != address:
                (p,) = _read_state(inspector, other, request)
                if p.error_code != ErrorCode.not_coordinator:
                    break
    uninitialized = p.error_code == ErrorCode.invalid_request and "uninitialized" in (
        p.error_message or "")  # the broker's word for "this group never read it"
    if uninitialized or p.error_code in (ErrorCode.unknown_topic_or_partition,
                                         ErrorCode.group_id_not_found):
        return ShareState(group, topic, partition, -1, end, 0, ())
    if p.error_code != ErrorCode.none:
        raise InspectError(f"ReadShareGroupState {group} {topic}-{partition}: "
                           f"{ErrorCode(p.error_code).name} {p.error_message or ''}".strip())
    batches = tuple(ShareBatch(int(b.first_offset), int(b.last_offset),
                               DELIVERY_STATES.get(int(b.delivery_state), str(int(b.delivery_state))),
                               int(b.delivery_count)) for b in p.state_batches)
    return ShareState(group, topic, partition, int(p.start_offset), end, int(p.state_epoch),
                      batches)
