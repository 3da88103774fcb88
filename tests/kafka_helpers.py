"""Small Kafka helpers shared by tests (plain confluent-kafka, nothing faked)."""
from __future__ import annotations

import time

from confluent_kafka import Consumer


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
