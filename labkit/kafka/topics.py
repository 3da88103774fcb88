"""Small, neutral Kafka helpers shared by the data loader, the pipelines and the audit.

Only plumbing lives here (create topics, read a topic back to its end, JSON values), so
that generator, pipelines and audit can each use real clients without importing each other.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from labkit.kafka import names as namespace
from labkit.kafka.clientlog import client_config

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


@dataclass(frozen=True)
class Rec:
    """One record as read back from a topic (control markers never show up here)."""

    partition: int
    offset: int
    key: str | None
    value: Any  # the JSON-decoded value
    # its timestamp in ms (CreateTime unless the topic says LogAppendTime); not compared:
    # two reads of one record are equal
    timestamp_ms: int | None = field(default=None, compare=False)


def encode(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


def decode(raw: bytes | None) -> Any:
    return None if raw is None else json.loads(raw)


def create(bootstrap: str, *names: str, partitions: int = 1, replication: int = -1,
           config: dict[str, str] | None = None,
           replica_assignment: list[list[int]] | None = None) -> None:
    """Create topics (an existing one is fine) and wait until every partition has a leader.

    ``replication`` -1 takes the cluster's default.replication.factor;
    ``replica_assignment`` instead names each partition's brokers, the first leading (its
    length is the partition count). Every helper here
    takes a learner's name (``payments``) or the broker's (``alice.payments``): both mean
    the broker's (``labkit.kafka.names``; the same name without a namespace).
    """
    names = tuple(namespace.topic(n) for n in names)
    # log_level 5: hide librdkafka's info line about purging its background queue on close.
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap, "log_level": 5}))
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=len(replica_assignment), replica_assignment=replica_assignment,
                  config=config or {}) if replica_assignment else
         NewTopic(n, num_partitions=partitions, replication_factor=replication, config=config or {})
         for n in names], operation_timeout=30)
    for future in futures.values():
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    wait_for_leaders(bootstrap, *names)


def delete(bootstrap: str, *names: str, timeout_s: float = 30.0) -> None:
    """Delete topics, best effort: one already gone, or a broker that does not answer in
    time, leaves nothing worse than a topic on disk."""
    names = tuple(namespace.topic(n) for n in names)
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap, "log_level": 5}))
    for future in admin.delete_topics(list(names), operation_timeout=timeout_s).values():
        try:
            future.result(timeout=timeout_s)
        except Exception:  # KafkaException (unknown topic, timeout): nothing to clean up
            pass
    # The controller has deleted them; wait until the metadata says so too, so a caller
    # that looks right afterwards does not see a topic about to vanish.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            listed = admin.list_topics(timeout=5).topics
        except KafkaException:
            return
        if not set(names) & set(listed):
            return
        time.sleep(0.2)


def wait_for_leaders(bootstrap: str, *names: str, timeout_s: float = 30.0) -> None:
    """Wait until every live broker's metadata shows every partition of ``names`` with a leader.

    The controller acknowledges CreateTopics before every broker has the new metadata; with
    three brokers, the one a client asks next may not know the topic for a moment. One
    client's metadata is not enough: librdkafka asks whichever broker it likes, so with more
    than one broker each is then asked itself (``_wait_on_each_broker``).
    """
    names = tuple(namespace.topic(n) for n in names)
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap, "log_level": 5}))
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(timeout=max(1.0, deadline - time.monotonic()))
        pending = [n for n in names
                   if (t := md.topics.get(n)) is None or t.error is not None or not t.partitions
                   or any(p.leader < 0 for p in t.partitions.values())]
        if not pending:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {pending} have no leader after {timeout_s:.0f} s on "
                               f"{bootstrap}; is every broker up? (labkit status)")
        time.sleep(0.1)
    if len(md.brokers) > 1:  # one broker: it has just answered, nobody else to ask
        _wait_on_each_broker([f"{b.host}:{b.port}" for b in md.brokers.values()],
                             {n: len(md.topics[n].partitions) for n in names}, deadline, timeout_s)


BROKER_TIMEOUT_S = 5.0  # one broker's connect or answer; a frozen one is passed over after it


def _wait_on_each_broker(addresses: list[str], partitions: dict[str, int], deadline: float,
                         timeout_s: float) -> None:
    """Ask each broker at ``addresses`` (as metadata advertises them: a fault proxy's own
    ports behind one) for Metadata until it shows each topic with ``partitions[topic]``
    partitions, all led. The lab's protocol connection picks the broker, and is secured as
    every lab client is (LABKIT_KAFKA_CONFIG: TLS, SASL PLAIN or SCRAM)."""
    # Imported here: kio's schemas cost an import only where a cluster has several brokers.
    from kio.schema.errors import ErrorCode
    from kio.schema.metadata.v12 import request as metadata
    from kio.schema.types import TopicName

    from labkit.kafka.protocol import Connection, ProtocolError

    request = metadata.MetadataRequest(
        topics=tuple(metadata.MetadataRequestTopic(topic_id=None, name=TopicName(n))
                     for n in partitions),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    for address in addresses:
        try:
            conn = Connection(address, min(BROKER_TIMEOUT_S, max(0.1, deadline - time.monotonic())))
        except OSError:
            # Killed, restarting, frozen or out of reach: no client gets an answer there
            # either, and a broker serves requests only once it has replayed the metadata log.
            continue
        except ProtocolError:
            # A SASL mechanism the protocol connection lacks (OAUTHBEARER): what one client's
            # metadata showed is all there is to go on, as before every broker was asked.
            return
        with conn:
            while True:
                try:
                    response = conn.send(request)
                except OSError:  # went away mid-wait: as above
                    break
                except ProtocolError:  # a broker too old for Metadata v12: as above
                    return
                pending = [str(t.name) for t in response.topics
                           if t.error_code != ErrorCode.none
                           or len(t.partitions) != partitions[str(t.name)]
                           or any(int(p.leader_id) < 0 for p in t.partitions)]
                if not pending:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"broker {address} does not show topics {pending} with a "
                                       f"leader after {timeout_s:.0f} s; is every broker up? "
                                       "(labkit status)")
                time.sleep(0.02)


def listing(bootstrap: str, timeout_s: float = 10.0) -> list[str]:
    """The topics a learner sees, by the broker's names: on a shared cluster those of the
    learner's namespace only (``labkit.kafka.names``); never Kafka's internal ``__`` topics."""
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap}))
    return sorted(namespace.only_mine(t for t in admin.list_topics(timeout=timeout_s).topics
                                      if not t.startswith("__")))


def partitions_of(bootstrap: str, topic: str, timeout_s: float = 10.0) -> list[int]:
    topic = namespace.topic(topic)
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap}))
    # A topic created a moment ago may be unknown yet to the broker asked (of three, each
    # learns of it in turn). ``create`` waits for each broker, but topics made elsewhere (a
    # learner's own AdminClient, a producer's auto-creation, a Java app's) do not: ask again
    # for a few seconds before calling one missing; only a truly missing topic pays for it.
    deadline = time.monotonic() + NEW_TOPIC_GRACE_S
    while True:
        meta = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is not None and meta.error is None and meta.partitions:
            return sorted(meta.partitions)
        if time.monotonic() > deadline:
            raise ValueError(f"topic {topic!r} does not exist on {bootstrap}")
        time.sleep(0.2)


NEW_TOPIC_GRACE_S = 3.0


def assign_all(consumer: Consumer, topic: str, start: dict[int, int] | None = None,
               timeout_s: float = 10.0) -> list[int]:
    """Assign every partition of ``topic`` at ``start`` offsets (default: the log start).

    Metadata is fetched first: assigning before the client knows the partition leader
    delays the first fetch by librdkafka's 500 ms offset-query retry.
    """
    topic = namespace.topic(topic)
    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise ValueError(f"topic {topic!r} does not exist")
    parts = sorted(meta.partitions)
    start = start or {}
    consumer.assign([TopicPartition(topic, p, start.get(p, OFFSET_BEGINNING)) for p in parts])
    return parts


def read(bootstrap: str, topic: str, isolation: str = "read_committed",
         timeout_s: float = 30.0) -> list[Rec]:
    """Every record of ``topic`` from the start to the end of each partition, in log order.

    The end is the high watermark for read_uncommitted and the last stable offset for
    read_committed (records of an open transaction are not read).
    """
    if isolation not in ISOLATION_LEVELS:
        raise ValueError(f"isolation must be one of {ISOLATION_LEVELS}, not {isolation!r}")
    topic = namespace.topic(topic)
    consumer = Consumer(client_config({
        "bootstrap.servers": bootstrap, "group.id": "labkit-reader",  # never commits
        "enable.auto.commit": False, "isolation.level": isolation,
        "enable.partition.eof": True, "fetch.wait.max.ms": 50,
    }))
    pending = set(assign_all(consumer, topic))
    out: list[Rec] = []
    deadline = time.monotonic() + timeout_s
    try:
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} ({isolation}) did not reach the end of "
                                   f"partitions {sorted(pending)} within {timeout_s:.0f} s "
                                   "(a hanging transaction stalls read_committed readers)")
            for msg in consumer.consume(500, timeout=0.1):
                err = msg.error()
                if err is None:
                    key = msg.key()
                    out.append(Rec(msg.partition(), msg.offset(),
                                   key.decode() if key is not None else None, decode(msg.value()),
                                   msg.timestamp()[1]))
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                elif not err.retriable():
                    raise KafkaException(err)
    finally:
        consumer.close()
    out.sort(key=lambda r: (r.partition, r.offset))
    return out
