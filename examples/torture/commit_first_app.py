"""A deliberately broken app: it commits the consumed offsets *before* its output is
flushed. A crash between the commit and the flush loses the records of that batch: the
restarted app starts after them. ``labkit torture`` must catch this.

    labkit torture --records 400 --kills 3 -- python examples/torture/commit_first_app.py

Otherwise the same app as exactly_once_app.py, without transactions (``--kafka-defaults``:
no static membership either).
"""
import argparse
import json
import os
import time

from confluent_kafka import Consumer, Producer

from kafka_config import kafka_config  # LABKIT_KAFKA_CONFIG: TLS and credentials, when set


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--work-ms", type=float, default=0.0, help="processing time per record")
    args.add_argument("--batch", type=int, default=20, help="records per commit")
    args.add_argument("--kafka-defaults", action="store_true", help="no static membership")
    opts = args.parse_args()
    work_s, batch = opts.work_ms / 1000, opts.batch
    bootstrap = os.environ["LABKIT_BOOTSTRAP"]
    group = os.environ["LABKIT_GROUP_ID"]
    static = {} if opts.kafka_defaults else {
        "group.instance.id": os.environ.get("LABKIT_INSTANCE_ID", f"{group}-1")}
    consumer = Consumer({**kafka_config(), "bootstrap.servers": bootstrap, "group.id": group,
                         **static, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    producer = Producer({**kafka_config(), "bootstrap.servers": bootstrap, "enable.idempotence": True})
    consumer.subscribe([os.environ["LABKIT_INPUT_TOPIC"]])
    out = os.environ["LABKIT_OUTPUT_TOPIC"]
    while True:
        msgs = [m for m in consumer.consume(batch, timeout=0.5) if m.error() is None]
        if not msgs:
            continue
        consumer.commit(asynchronous=False)  # THE BUG: the batch counts as done already
        for m in msgs:
            record = json.loads(m.value())
            time.sleep(work_s)
            record["processed"] = True
            producer.produce(out, key=m.key(), value=json.dumps(record).encode())
        producer.flush(30)


if __name__ == "__main__":
    main()
