"""What a local broker is told: its server.properties (the lab's short timings, the internal
topics sized for 1 or 3 brokers, a failure lab's dedicated controller), its log4j2 file and
the KRaft cluster id its storage is formatted with."""
from __future__ import annotations

import base64
import uuid
from pathlib import Path

from labkit.kafka.broker import Broker


def new_cluster_id() -> str:
    """A KRaft cluster id: a base64url UUID that does not start with '-' (the storage tool
    would read that as an option; Kafka's own Uuid.randomUuid() avoids it the same way)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


# A failure lab (``LocalCluster(controller="dedicated")``): the KRaft quorum is one node of
# its own, so freezing two brokers never takes the quorum with them and the controller can
# still shrink ISRs and elect leaders. Its timings are short so a lesson sees each step in
# seconds: a follower that fetched nothing for 4 s leaves the ISR (Kafka: 30 s); a broker
# silent for 4 s is fenced and its partitions move (Kafka: 9 s).
FAILURE_LAB_PROPERTIES = {
    "replica.lag.time.max.ms": 4000,
    "broker.session.timeout.ms": 4000,
    "broker.heartbeat.interval.ms": 500,
    # An inter-broker request to a broker that has just died (a transaction marker) is
    # given up and sent again only after this: measured, Kafka's 30 s stalled the next
    # transaction after a coordinator failover for 30 s, 5 s for ~7 s.
    "request.timeout.ms": 5000,
}
CONTROLLER_NODE_ID = 100


def controller_properties(node: Broker, voters: str, listeners: list[str] | None = None) -> str:
    """A controller-only KRaft node (the quorum of a failure lab); ``listeners``: a
    partitionable lab's (``partitionable_controller``)."""
    return "\n".join([
        "process.roles=controller",
        f"node.id={node.node_id}",
        f"controller.quorum.voters={voters}",
        *(listeners or [f"listeners=CONTROLLER://127.0.0.1:{node.controller_port}",
                        "controller.listener.names=CONTROLLER",
                        "listener.security.protocol.map=CONTROLLER:PLAINTEXT"]),
        f"log.dirs={Path(node.dir) / 'data'}",
        *(f"{k}={v}" for k, v in FAILURE_LAB_PROPERTIES.items()),
        "",
    ])


def controller_listener(broker_id: int) -> str:
    return f"CONTROLLER_{broker_id}"


def partitionable_controller(links: dict[int, tuple[int, int]]) -> list[str]:
    """A partitionable failure lab's controller: a listener per broker (broker id ->
    (forwarder's port, real port)), each ADVERTISING that broker's forwarder. Measured on
    Kafka 4.4: a broker reaches the controller at its static voter address only until its
    first metadata fetch; from then on its KRaft client uses the endpoint the controller
    advertises for the broker's controller listener (KIP-853's leader endpoints). Measured
    with a forwarder named only in controller.quorum.voters: every controller connection
    went through it until it was cut; then the broker was fenced (its heartbeats stopped)
    but opened a new connection straight to the controller's advertised port and went on
    fetching metadata (it learnt of its replacement within a second). Here the advertised
    port is the forwarder's too, and a cut broker has no connection to the controller."""
    names = [controller_listener(b) for b in links]
    return [
        "listeners=" + ",".join(f"{n}://127.0.0.1:{real}" for n, (_, real) in zip(names, links.values())),
        "advertised.listeners=" + ",".join(
            f"{n}://127.0.0.1:{front}" for n, (front, _) in zip(names, links.values())),
        "controller.listener.names=" + ",".join(names),
        "listener.security.protocol.map=" + ",".join(f"{n}:PLAINTEXT" for n in names),
    ]


def partitionable_listeners(broker: Broker, replication_port: int, replication_front: int) -> list[str]:
    """A partitionable failure lab's broker (``LocalCluster(network=...)``): clients keep
    the direct PLAINTEXT listener; the brokers copy from each other on REPLICATION, whose
    advertised port is the broker's forwarder (``labkit.faults.partition``), so a follower
    fetches from this broker through a link that can be cut. It reaches the controller on a
    controller listener of its own (``partitionable_controller``)."""
    own = controller_listener(broker.node_id)
    return [
        f"listeners=PLAINTEXT://127.0.0.1:{broker.port},REPLICATION://127.0.0.1:{replication_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{broker.port},"
        f"REPLICATION://127.0.0.1:{replication_front}",
        f"controller.listener.names={own}",
        "inter.broker.listener.name=REPLICATION",
        f"listener.security.protocol.map={own}:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
        "REPLICATION:PLAINTEXT",
    ]


def broker_properties(broker: Broker, voters: str, n_brokers: int,
                      listeners: list[str] | None = None, dedicated_controller: bool = False,
                      extra: dict[str, object] | None = None) -> str:
    """``listeners``: the listener lines of a secure lab (``labkit.kafka.secure``), else plaintext.
    ``dedicated_controller``: a broker-only node of a failure lab (the quorum runs apart).
    ``extra``: settings a private lab's experiment needs (they come last, so they win)."""
    replicated = n_brokers >= 3
    rf, min_isr = (3, 2) if replicated else (1, 1)
    own_listeners = (
        [f"listeners=PLAINTEXT://127.0.0.1:{broker.port}"] if dedicated_controller else
        [f"listeners=PLAINTEXT://127.0.0.1:{broker.port},CONTROLLER://127.0.0.1:{broker.controller_port}"])
    return "\n".join([
        "process.roles=broker" if dedicated_controller else "process.roles=broker,controller",
        f"node.id={broker.node_id}",
        f"controller.quorum.voters={voters}",
        *(listeners or [
            *own_listeners,
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{broker.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        ]),
        *(f"{k}={v}" for k, v in FAILURE_LAB_PROPERTIES.items() if dedicated_controller),
        f"log.dirs={Path(broker.dir) / 'data'}",
        f"default.replication.factor={rf}",
        f"min.insync.replicas={min_isr}",
        f"offsets.topic.replication.factor={rf}",
        f"transaction.state.log.replication.factor={rf}",
        f"transaction.state.log.min.isr={min_isr}",
        # Share groups (KIP-932): the share coordinator's state topic __share_group_state
        # asks for 3 replicas by default, which one broker cannot create
        # (INVALID_REPLICATION_FACTOR), so it is sized like the two topics above.
        f"share.coordinator.state.topic.replication.factor={rf}",
        f"share.coordinator.state.topic.min.isr={min_isr}",
        "share.coordinator.state.topic.num.partitions=5",
        # Record lock 10 s (Kafka: 30 s). A killed consumer's records come back when its
        # connection drops, not when the lock expires; the lock only frees the records of a
        # consumer that is alive but stuck, and must outlast a slow one's work on a loaded
        # laptop (at 2 s, acks came too late: INVALID_RECORD_STATE, records processed twice).
        # The minimum is lowered (15 s -> 1 s) so a lesson can set a short lock per group
        # (share.record.lock.duration.ms). Delivery limit: Kafka's default 5, written out
        # because the lessons cite it.
        "group.share.min.record.lock.duration.ms=1000",
        "group.share.record.lock.duration.ms=10000",
        "group.share.delivery.count.limit=5",
        # A share consumer gets its assignment on its second heartbeat: 1 s instead of 5 s
        # (Kafka's default) to its first record; a dead member leaves after 6 s, like the
        # consumer groups above.
        "group.share.min.heartbeat.interval.ms=1000",
        "group.share.heartbeat.interval.ms=1000",
        "group.share.min.session.timeout.ms=6000",
        "group.share.session.timeout.ms=6000",
        # Lab-sized internals: fewer partitions start faster on a laptop.
        "offsets.topic.num.partitions=5",
        "transaction.state.log.num.partitions=5",
        # A lone consumer gets its partitions at once instead of after 3 s.
        "group.initial.rebalance.delay.ms=0",
        # Both group protocols notice a dead member after 6 s (the classic protocol's client
        # asks for that; the KIP-848 consumer protocol takes it from the broker, 45 s by
        # default), so the two can be compared in a lesson.
        "group.consumer.min.session.timeout.ms=6000",
        "group.consumer.session.timeout.ms=6000",
        "group.consumer.min.heartbeat.interval.ms=1000",
        "group.consumer.heartbeat.interval.ms=1000",
        # Timed-out (hanging) transactions are aborted within ~1 s instead of ~10 s.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000",
        "auto.create.topics.enable=true",
        *(f"{k}={v}" for k, v in (extra or {}).items()),
        "",
    ])


LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
"""
