"""The inspector against the real broker: batches, markers, LSO/HW, producer state,
open transactions, group offsets, and the `labkit inspect` CLI."""
from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.broker_heartbeat.v0.request import BrokerHeartbeatRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.types import BrokerId
from kio.static.primitive import i64
from typer.testing import CliRunner

from labkit.kafka import protocol, topics
from labkit.cli import app
from labkit.kafka.inspect import (Batch, Inspector, UnknownTopicError, count_states, describe_topic,
                            offset_states, snapshot_topic)
from tests.kafka_helpers import end_transaction, produce_txn, transactional_producer


@pytest.fixture
def txn_topic(bootstrap: str, topic_name: str):
    """One committed transaction (3 records) then an aborted one (2 records); the view
    taken while the second was still open is returned too."""
    topics.create(bootstrap, topic_name)
    producer = transactional_producer(bootstrap, f"txn-{topic_name}")
    produce_txn(producer, topic_name, ["a", "b", "c"])
    end_transaction(producer, bootstrap, topic_name, commit=True)
    produce_txn(producer, topic_name, ["d", "e"])
    while_open = describe_topic(bootstrap, topic_name)
    end_transaction(producer, bootstrap, topic_name, commit=False)
    return topic_name, while_open


def shape(batches: list[Batch]) -> list[tuple]:
    return [(b.base_offset, b.last_offset, b.record_count, b.base_sequence, b.is_transactional,
             b.is_control, b.marker) for b in batches]


def test_committed_then_aborted_transaction_markers(bootstrap: str, txn_topic) -> None:
    topic, _ = txn_topic
    view = describe_topic(bootstrap, topic)
    (part,) = view.partitions
    assert shape(list(part.batches)) == [
        (0, 2, 3, 0, True, False, None),      # data of the committed transaction
        (3, 3, 1, -1, True, True, "COMMIT"),  # its marker takes an offset
        (4, 5, 2, 3, True, False, None),      # data of the aborted transaction
        (6, 6, 1, -1, True, True, "ABORT"),
    ]
    assert len({(b.producer_id, b.producer_epoch) for b in part.batches}) == 1
    assert (part.log_start, part.lso, part.high_watermark) == (0, 7, 7)
    assert [r.key for r in part.batches[0].records] == [b"a", b"b", b"c"]
    assert view.transactions == ()


def test_lso_held_back_while_transaction_open(bootstrap: str, txn_topic) -> None:
    _, open_view = txn_topic
    (part,) = open_view.partitions
    assert part.lso == 4 < part.high_watermark == 6  # first offset of the open transaction
    assert [b.marker for b in part.batches if b.is_control] == ["COMMIT"]
    (state,) = part.producers
    assert state.open_transaction and state.txn_start_offset == 4
    (txn,) = open_view.transactions
    assert txn.state == "Ongoing" and txn.producer_id == state.producer_id
    assert (open_view.topic, 0) in txn.partitions
    assert "open transaction holds the LSO back" in open_view.to_text()
    stable = open_view.to_text(producer_ids=False)
    assert "producer P1 epoch 0 last sequence 4, transaction: open since offset 4" in stable
    assert f"producer {state.producer_id} " in open_view.to_text()


def test_offset_states_follow_markers(bootstrap: str, txn_topic) -> None:
    topic, open_view = txn_topic
    assert [s.state for s in offset_states(open_view.batches)] == [
        "committed"] * 3 + ["commit", "open", "open"]
    # A retry that re-sends an id already in the log (outside any transaction).
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100})
    producer.produce(topic, key=b"b", value=b"again")
    producer.produce(topic, key=b"d", value=b"first visible copy of d")
    producer.flush(30)
    states = offset_states(describe_topic(bootstrap, topic).batches)
    assert [(s.offset, s.state, s.business_id) for s in states] == [
        (0, "committed", "a"), (1, "committed", "b"), (2, "committed", "c"), (3, "commit", None),
        (4, "aborted", "d"), (5, "aborted", "e"), (6, "abort", None),
        (7, "duplicate", "b"), (8, "committed", "d")]  # an aborted d is no earlier copy
    assert count_states(states) == {"committed": 4, "open": 0, "aborted": 2, "commit": 1,
                                    "abort": 1, "duplicate": 1}


def test_describe_producers_shows_idempotent_producer(bootstrap: str, topic_name: str) -> None:
    topics.create(bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(5):  # one batch each: sequences 0..4
        producer.produce(topic_name, key=str(i).encode(), value=b"v")
        producer.flush(30)
    with Inspector(bootstrap) as inspector:
        (state,) = inspector.producers(topic_name)
        batches = inspector.batches(topic_name, 0, 0, 5)
    assert [b.base_sequence for b in batches] == [0, 1, 2, 3, 4]
    assert {b.producer_id for b in batches} == {state.producer_id}
    assert (state.producer_epoch, state.last_sequence, state.open_transaction) == (0, 4, False)
    assert not any(b.is_transactional or b.is_control for b in batches)


def test_group_offsets_match_commits(bootstrap: str, topic_name: str) -> None:
    topics.create(bootstrap, topic_name, partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(6):
        producer.produce(topic_name, value=b"v", partition=i % 2)
    producer.flush(30)
    group = f"g-{topic_name}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic_name, 0, 2), TopicPartition(topic_name, 1, 3)],
                        asynchronous=False)
    finally:
        consumer.close()
    view = describe_topic(bootstrap, topic_name)
    assert view.group_offsets == {group: {0: 2, 1: 3}}
    assert view.offsets_frame()[f"group:{group}"].tolist() == [2, 3]
    assert [(p.partition, p.high_watermark) for p in view.partitions] == [(0, 3), (1, 3)]


def test_unknown_topic_is_a_clear_error_and_not_created(bootstrap: str, topic_name: str) -> None:
    with pytest.raises(UnknownTopicError, match=f"{topic_name}.*does not exist"):
        describe_topic(bootstrap, topic_name)
    with pytest.raises(ValueError):  # still absent: the inspector never auto-creates
        describe_topic(bootstrap, topic_name)


def test_cli_inspect_json(bootstrap: str, txn_topic, monkeypatch) -> None:
    topic, _ = txn_topic
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    result = CliRunner().invoke(app, ["inspect", topic, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (part,) = data["partitions"]
    assert {"log_start", "lso", "high_watermark", "batches"} <= set(part)
    assert [set(b) for b in part["batches"]] == [{
        "base_offset", "last_offset", "producer_id", "producer_epoch", "base_sequence",
        "is_transactional", "is_control", "marker"}] * 4
    assert [b["marker"] for b in part["batches"]] == [None, "COMMIT", None, "ABORT"]
    text = CliRunner().invoke(app, ["inspect", topic])
    assert "ABORT marker" in text.stdout and "LSO 7" in text.stdout
    missing = CliRunner().invoke(app, ["inspect", topic + "-missing"])
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


def test_describing_a_transactional_id_without_a_transaction_does_not_fail(bootstrap, topic_name):
    """Empty or finished transactional ids carry start time -1, which kio cannot read as a
    timestamp; the inspector leaves them out instead of failing (they hold nothing open)."""

    idle = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"idle-{topic_name}"})
    idle.init_transactions(30)  # Empty: no transaction yet
    busy = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"busy-{topic_name}"})
    busy.init_transactions(30)
    busy.begin_transaction()
    busy.produce(topic_name, value=b"open")
    busy.flush(10)
    try:
        with Inspector(bootstrap) as inspector:
            described = inspector.describe_transactions([f"idle-{topic_name}", f"busy-{topic_name}"])
            assert [t.transactional_id for t in described] == [f"busy-{topic_name}"]
            assert described[0].state == "Ongoing"
    finally:
        busy.abort_transaction(30)


def test_a_request_the_broker_does_not_speak_is_a_clear_error(bootstrap: str) -> None:
    # BrokerHeartbeat exists only on the controller listener, never on the one clients use.
    heartbeat = BrokerHeartbeatRequest(broker_id=BrokerId(1), broker_epoch=i64(0),
                                       current_metadata_offset=i64(0), want_fence=False,
                                       want_shut_down=False)
    with protocol.Connection(bootstrap.split(",")[0]) as conn:
        low, high = conn.supported_versions()[1]  # Fetch
        assert low <= 12 <= high  # the version the inspector sends
        with pytest.raises(protocol.ProtocolError, match="BrokerHeartbeat v0.*does not speak it"):
            conn.send(heartbeat)
        # Refused before it went out, so the connection still works.
        assert conn.send(MetadataRequest(topics=None, include_topic_authorized_operations=False)).brokers


def test_a_snapshot_asks_for_the_topic_leaders_once(bootstrap: str, topic_name: str,
                                                    monkeypatch) -> None:
    topics.create(bootstrap, topic_name, partitions=3)
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(3):
        producer.produce(topic_name, value=b"v", partition=p)
    assert producer.flush(10) == 0
    asked: list[str] = []
    real_send = Inspector._send

    def counting_send(self, address, request):
        if isinstance(request, MetadataRequest) and request.topics:
            asked.append(str(request.topics[0].name))
        return real_send(self, address, request)

    monkeypatch.setattr(Inspector, "_send", counting_send)
    with Inspector(bootstrap) as inspector:
        view = snapshot_topic(inspector, topic_name)  # offsets, producers, 3 partitions' batches
        assert [len(p.batches) for p in view.partitions] == [1, 1, 1]
        assert asked == [topic_name]
        inspector.offsets(topic_name)  # outside a snapshot, leaders are asked afresh
        assert asked == [topic_name, topic_name]
