"""Small Kafka helpers shared by tests (plain confluent-kafka, nothing faked)."""
from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer

from labkit.kafka.inspect import Inspector


def consume_all(bootstrap: str, topic: str, expect: int, isolation: str = "read_committed",
                timeout_s: float = 30.0) -> list[bytes]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"read-{topic}-{isolation}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "isolation.level": isolation,
    })
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(values) < expect:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                values.append(msg.value())
        # A little longer, so that records beyond `expect` would be seen too.
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def transactional_producer(bootstrap: str, txn_id: str) -> Producer:
    # linger lets each transaction's records leave in one batch, so offsets are predictable
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                         "compression.type": "none", "linger.ms": 100})
    producer.init_transactions(30)
    return producer


def produce_txn(producer: Producer, topic: str, keys: list[str]) -> None:
    producer.begin_transaction()
    for key in keys:
        producer.produce(topic, key=key.encode(), value=b"v")
    producer.flush(30)


def end_transaction(producer: Producer, bootstrap: str, topic: str, commit: bool) -> None:
    """Commit/abort and wait for the marker: the coordinator writes markers *after* it
    answers EndTxn, so a record produced right away could land before the marker."""
    (producer.commit_transaction if commit else producer.abort_transaction)(30)
    with Inspector(bootstrap) as inspector:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(o.lso == o.high_watermark for o in inspector.offsets(topic).values()):
                return
            time.sleep(0.05)
    raise AssertionError(f"the transaction marker never reached {topic}")
