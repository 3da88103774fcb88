"""A share group (KIP-932, "queues for Kafka"): N consumers take records from one partition.

Each record a consumer gets is *acquired*: locked for it for the group's record lock
(the lab broker: 10 s). The consumer then acknowledges it, one record at a time:

- ACCEPT: done, never delivered again;
- RELEASE: give it back now, to be delivered again (its delivery count goes up);
- REJECT: give up on it: the broker *archives* it, it is never delivered again.

A consumer that dies (SIGKILL) drops its connection: the broker releases every record it
held at once (measured: 0.05 s, with a 20 s lock). A lock that expires (the consumer is
alive but stuck or too slow) releases the record like RELEASE; the consumer's late ACCEPT
is then refused (INVALID_RECORD_STATE), unless another consumer has meanwhile accepted the
record: then commit_sync reports no error at all (measured, docs/measurements-share.md).
After ``group.share.delivery.count.limit`` deliveries (the lab broker: 5) a released
record is archived instead. There is no offset to commit and none to rewind.

The worker writes one output record per processing attempt, ``{"id", "key", "consumer",
"attempt", "delivery_count", "outcome"}``: outcome ``processed`` is the business work (the
audit counts those), ``released``/``rejected`` a poison record the work failed on.

- at_least_once: process, then acknowledge (a crash in between: the record comes back
  and is processed twice);
- at_most_once: acknowledge, then process (a crash in between: the record is gone);
- exactly_once: not offered. An acknowledgement cannot join a Kafka transaction (that is
  a proposal, KIP-1289, under discussion; not in Kafka 4.4), so the output and the ACCEPT
  never commit together.

``ack_mode="explicit"`` acknowledges and commits each record on its own (the crash points
fire per record, so a crash repeats exactly one record); ``"implicit"`` lets the client
accept a whole poll's records at the next poll or commit (the points around the
acknowledgement fire per poll, so a crash repeats that poll's records: all the broker handed
over, as the ShareConsumer of confluent-kafka 2.16.1 ignores ``max.poll.records``).
"""
from __future__ import annotations

import json
import time

from confluent_kafka import AcknowledgeType, KafkaException, Message, ShareConsumer
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ResourceType)

from labkit import settings

from labkit.checking import history

from labkit.kafka import names
from labkit.kafka.clientlog import client_config
from labkit.faults.crashpoints import crash_point
from labkit.pipelines.common import PIPELINE_TUNING, record_of
from labkit.pipelines.guarantee import guarantee as guarantee_named

ACK_MODES = ("explicit", "implicit")
POISON_ACTIONS = ("release", "reject")
SHARE_GUARANTEES = ("at_least_once", "at_most_once")
# The lab broker's settings (labkit.kafka.brokerconfig): the lock and the delivery limit.
RECORD_LOCK_S = 10.0
DELIVERY_LIMIT = 5
# What Kafka 4.4 accepts for a group's own share.delivery.count.limit (asked: 1 is refused,
# "must be at least 2"; 11, "must be in the range 2 to 10 inclusive").
DELIVERY_LIMIT_RANGE = (2, 10)
# A worker stops once it has polled nothing for this long *since it was assigned the
# partition* (or since its last record). A crashed consumer's records come back as soon as
# its connection drops, so the restarted member gets them at its first fetch.
IDLE_S = 6.0
# How long a member may wait for its first assignment (the group's join). Measured: 3.8 s
# after subscribing for a broker's first share group on an idle machine; under a CI load,
# more than 6 s (counted from the start, 3 of 15 frozen runs then ended idle before any
# record: docs/measurements.md). 60 s is ten times the 6 s that was too short, and under a
# whole frozen run's time under load (27-71 s); a member not assigned by then has a
# broken group (no coordinator): it fails, saying so, instead of ending as if all was done.
JOIN_LIMIT_S = 60.0
# The ShareConsumer has no assignment(): its statistics (cgrp.assignment_size) tell.
STATS_INTERVAL_MS = 250
OUTCOMES = ("processed", "released", "rejected")
NO_EXACTLY_ONCE = (
    "share groups offer no exactly_once: an acknowledgement cannot join a Kafka transaction "
    "(transactional acknowledgements are a proposal, KIP-1289, not in Kafka 4.4), so the "
    "output and the ACCEPT never commit together; choose at_least_once or at_most_once")


def check_options(guarantee: str, ack_mode: str, poison: str, poison_ids: list[str]) -> None:
    """ValueError naming the valid choices for anything a share-group run cannot do."""
    if guarantee == "exactly_once":
        raise ValueError(NO_EXACTLY_ONCE)
    if guarantee not in SHARE_GUARANTEES:
        raise ValueError(f"unknown guarantee {guarantee!r}; a share group runs "
                         f"{' or '.join(SHARE_GUARANTEES)}")
    if ack_mode not in ACK_MODES:
        raise ValueError(f"ack_mode must be one of {', '.join(ACK_MODES)}, not {ack_mode!r}")
    if poison not in POISON_ACTIONS:
        raise ValueError(f"poison must be one of {', '.join(POISON_ACTIONS)}, not {poison!r}")
    if poison_ids and ack_mode != "explicit":
        raise ValueError("a poison record needs ack_mode='explicit': only an explicit "
                         "acknowledgement can RELEASE or REJECT one record")


SETTINGS = ("group.share.record.lock.duration.ms", "group.share.delivery.count.limit",
            "share.coordinator.state.topic.replication.factor")


def broker_settings(bootstrap: str, names: tuple[str, ...] = SETTINGS) -> dict[str, str]:
    """The share-group settings a broker of the cluster really runs with (DescribeConfigs)."""
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap}))
    broker = min(admin.list_topics(timeout=10).brokers)
    resource = ConfigResource(ResourceType.BROKER, str(broker))
    config = admin.describe_configs([resource])[resource].result(timeout=30)
    return {name: config[name].value for name in names}


def prepare_group(bootstrap: str, group_id: str, record_lock_ms: int | None = None,
                  delivery_limit: int | None = None) -> None:
    """Share groups start at the log's *end* by default (share.auto.offset.reset=latest, a
    group config, not a client one); the lab's groups read the input from its start.
    ``record_lock_ms`` and ``delivery_limit`` override the broker's record lock and delivery
    limit for this group only (group configs, Kafka 4.4)."""
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap}))
    settings = {"share.auto.offset.reset": "earliest"}
    if record_lock_ms is not None:
        settings["share.record.lock.duration.ms"] = str(record_lock_ms)
    if delivery_limit is not None:
        settings["share.delivery.count.limit"] = str(delivery_limit)
    resource = ConfigResource(ResourceType.GROUP, names.group(group_id), incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in settings.items()])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)


def run(bootstrap: str, input_topic: str, output_topic: str, group_id: str, guarantee: str,
        batch_size: int = 10, ack_mode: str = "explicit", poison_ids: list[str] | None = None,
        poison: str = "release", idle_s: float = IDLE_S) -> None:
    """Take records from ``input_topic`` as a member of share group ``group_id`` until the
    queue has been empty for ``idle_s`` (counted from the member's assignment, then from its
    last record); write each processing to ``output_topic``.

    ``poison_ids``: records whose processing always fails; the worker ``poison``s them
    (``release``: hand back for a retry, archived by the broker at the delivery limit;
    ``reject``: archived at once). ``batch_size`` is max.poll.records."""
    poison_ids = [str(p) for p in poison_ids or []]
    check_options(guarantee, ack_mode, poison, poison_ids)
    input_topic, output_topic = names.topic(input_topic), names.topic(output_topic)
    g = guarantee_named(guarantee)
    out = g.open_output(bootstrap, tuning=PIPELINE_TUNING)
    me = settings.current().instance or "0"
    queue_end = QueueEnd(idle_s)
    consumer = ShareConsumer(client_config({
        "bootstrap.servers": bootstrap, "group.id": group_id,
        "share.acknowledgement.mode": ack_mode, "max.poll.records": batch_size,
        **queue_end.settings}))
    consumer.subscribe([input_topic])
    try:
        while not queue_end.reached():
            messages = [m for m in consumer.poll(0.5) if _ok(m)]
            if not messages:
                continue
            history.record("acquired", offsets=[m.offset() for m in messages])
            if ack_mode == "explicit":
                for n, msg in enumerate(messages):
                    if not _one_explicit(consumer, out, output_topic, msg, me, g.name,
                                         poison_ids, poison):
                        # A refused ACCEPT: this poll's records were acquired together, so
                        # their locks expired together; the broker made them available
                        # again. Working on the rest would process each one twice.
                        _drop_stale(consumer, messages[n + 1:])
                        break
            else:
                _one_poll_implicit(consumer, out, output_topic, messages, me, g.name)
            queue_end.saw(messages)
    finally:
        consumer.close()  # commits what was acknowledged, leaves the group at once
        out.flush(60)


class QueueEnd:
    """When a share consumer's run is over, by the lab's rule: no record for ``idle_s`` since
    the member was assigned its partition, or since its last record. A member not assigned
    within JOIN_LIMIT_S has a broken group: ``reached()`` raises TimeoutError.

    The ShareConsumer has no assignment(): ``settings`` (merged into its config) make its
    statistics say when it got one. A learner's loop uses it as the reference loop does:

        queue_end = QueueEnd()
        consumer = ShareConsumer(client_config({..., **queue_end.settings}))
        while not queue_end.reached():
            polled = consumer.poll(0.5)
            ...                                  # the records' work and acknowledgements
            queue_end.saw(polled)
    """

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self.started = time.monotonic()
        self.assigned_at: float | None = None
        self.last_record: float | None = None

    @property
    def settings(self) -> dict:
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self._on_stats}

    def _on_stats(self, raw: str) -> None:
        if self.assigned_at is None and \
                json.loads(raw).get("cgrp", {}).get("assignment_size", 0) > 0:
            self.assigned_at = time.monotonic()

    def saw(self, polled) -> None:
        """After a poll's records were handled: any record (an error event is none) restarts
        the idle clock."""
        if any(m.error() is None for m in polled):
            self.last_record = time.monotonic()

    def reached(self) -> bool:
        return _idle(self.started, self.assigned_at, self.last_record, self.idle_s)


def _idle(started: float, assigned_at: float | None, last_record: float | None,
          idle_s: float) -> bool:
    """Has the queue been empty for ``idle_s`` since the member could take records (its
    assignment) or since its last record? Not assigned within JOIN_LIMIT_S: TimeoutError."""
    quiet_since = last_record or assigned_at
    now = time.monotonic()
    if quiet_since is None:
        if now - started > JOIN_LIMIT_S:
            raise TimeoutError(f"this share-group member was not assigned a partition within "
                               f"{JOIN_LIMIT_S:.0f} s of subscribing (the group's join never "
                               "completed); is the broker up? (labkit status)")
        return False
    return now - quiet_since >= idle_s


def _ok(msg: Message) -> bool:
    err = msg.error()
    if err is None:
        return True
    if err.fatal() or not err.retriable():
        raise KafkaException(err)
    return False


def _commit(consumer: ShareConsumer, msg: Message | None = None) -> bool:
    """Send the acknowledgements now and wait for the broker's answer. A refused one
    (INVALID_RECORD_STATE: the record's lock expired before the ACCEPT arrived, so it is
    no longer ours) cannot be taken back: the broker delivers the record again, and it is
    processed twice. It goes to the run's history; the audit counts the duplicate."""
    failed = {f"{tp.topic}-{tp.partition}": str(err)
              for tp, err in consumer.commit_sync().items() if err is not None}
    if failed:
        history.record("ack-refused", errors=failed,
                       offsets=[msg.offset()] if msg is not None else None)
    return not failed


def _drop_stale(consumer: ShareConsumer, stale: list[Message]) -> None:
    """Leave the rest of a poll whose locks expired unprocessed. The client refuses the next
    poll while any record of the last one is unacknowledged (IllegalStateException), so each
    is RELEASEd (to the client's bookkeeping; whatever the broker answers for records no
    longer ours changes nothing, so the answer is not looked at)."""
    history.record("stale-skipped", offsets=[m.offset() for m in stale])
    for msg in stale:
        consumer.acknowledge(msg, AcknowledgeType.RELEASE)
    if stale:
        consumer.commit_sync()


def _write(out, topic: str, msg: Message, me: str, outcome: str) -> None:
    record = record_of(msg)
    out.produce(topic, str(record["key"]), {
        "id": record["id"], "key": record["key"], "consumer": me, "attempt": history.attempt(),
        "delivery_count": msg.delivery_count(), "outcome": outcome})
    out.flush(60)  # the work is done (durable) before anything is acknowledged


def _one_explicit(consumer: ShareConsumer, out, topic: str, msg: Message, me: str,
                  guarantee: str, poison_ids: list[str], poison: str) -> bool:
    """Work on one record and acknowledge it; False if the broker refused the
    acknowledgement (the record's lock had expired: it is no longer this consumer's)."""
    crash_point("after-acquire-before-process")
    if str(record_of(msg)["id"]) in poison_ids:
        # The work fails on this record, every time: hand it back or give up on it.
        _write(out, topic, msg, me, "released" if poison == "release" else "rejected")
        consumer.acknowledge(msg, AcknowledgeType.RELEASE if poison == "release"
                             else AcknowledgeType.REJECT)
        return _commit(consumer, msg)
    if guarantee == "at_most_once":
        consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
        accepted = _commit(consumer, msg)
        crash_point("after-ack")
        if accepted:  # a refused ACCEPT: the record is someone else's now, leave its work
            _write(out, topic, msg, me, "processed")
        return accepted
    _write(out, topic, msg, me, "processed")
    crash_point("after-process-before-ack")
    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
    accepted = _commit(consumer, msg)  # this record's ACCEPT reaches the broker now, not at the next poll
    crash_point("after-ack")
    return accepted


def _one_poll_implicit(consumer: ShareConsumer, out, topic: str, messages: list[Message],
                       me: str, guarantee: str) -> None:
    """Implicit acknowledgement: commit_sync (or the next poll) ACCEPTs *every* record of
    the last poll, processed or not."""
    if guarantee == "at_most_once":
        _commit(consumer)
        crash_point("after-ack")
    for msg in messages:
        crash_point("after-acquire-before-process")
        _write(out, topic, msg, me, "processed")
    if guarantee == "at_least_once":
        crash_point("after-process-before-ack")
        _commit(consumer)
        crash_point("after-ack")
