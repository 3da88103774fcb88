"""An at-least-once app with Kafka's default client settings (dynamic membership, a 45 s
session): each batch's output is written and flushed, then its offsets committed. A crash
between the flush and the commit writes the batch again after the restart: duplicates,
nothing lost.

    labkit torture --schedule production --instances 2 --kills 0 -- \\
        python examples/torture/at_least_once_app.py
"""
import json
import os

from confluent_kafka import Consumer, Producer

from kafka_config import kafka_config  # LABKIT_KAFKA_CONFIG: TLS and credentials, when set


def main() -> None:
    bootstrap = os.environ["LABKIT_BOOTSTRAP"]
    consumer = Consumer({**kafka_config(), "bootstrap.servers": bootstrap,
                         "group.id": os.environ["LABKIT_GROUP_ID"],
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({**kafka_config(), "bootstrap.servers": bootstrap})
    consumer.subscribe([os.environ["LABKIT_INPUT_TOPIC"]])
    out = os.environ["LABKIT_OUTPUT_TOPIC"]
    while True:
        msgs = [m for m in consumer.consume(20, timeout=0.5) if m.error() is None]
        if not msgs:
            continue
        for m in msgs:
            record = json.loads(m.value())
            record["processed"] = True
            producer.produce(out, key=m.key(), value=json.dumps(record).encode())
        if producer.flush(30):
            raise RuntimeError("output not delivered in 30 s")
        consumer.commit(asynchronous=False)  # only what is written counts as done


if __name__ == "__main__":
    main()
