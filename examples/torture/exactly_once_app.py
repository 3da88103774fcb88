"""A consume-transform-produce app written the way a user would, with plain confluent-kafka.

It reads LABKIT_INPUT_TOPIC, adds a field to each record and writes it to
LABKIT_OUTPUT_TOPIC. Output records and the consumed offsets are committed in one
transaction (KIP-447: the offsets carry the consumer's group metadata), so a crash anywhere
replays exactly the records whose output was aborted: exactly-once.

    labkit torture --input 400 --kills 3 -- python examples/torture/exactly_once_app.py

It runs until it is stopped, like a real streaming app. ``--work-ms`` is the processing
time per record (a real app does something per record; it also gives the harness's kills
something to interrupt).
"""
import argparse
import json
import os
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from kafka_config import kafka_config  # LABKIT_KAFKA_CONFIG: TLS and credentials, when set


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--work-ms", type=float, default=0.0, help="processing time per record")
    args.add_argument("--batch", type=int, default=20, help="records per transaction")
    work_s = args.parse_args().work_ms / 1000
    batch = args.parse_args().batch
    bootstrap = os.environ["LABKIT_BOOTSTRAP"]
    group = os.environ["LABKIT_GROUP_ID"]
    consumer = Consumer({
        **kafka_config(), "bootstrap.servers": bootstrap, "group.id": group,
        # Static membership: a restarted instance takes its predecessor's place at once
        # instead of waiting for the dead one's session to time out.
        "group.instance.id": f"{group}-1",
        "enable.auto.commit": False,  # offsets are committed inside the transaction
        "isolation.level": "read_committed",  # never process another app's aborted output
        "auto.offset.reset": "earliest",
    })
    producer = Producer({
        **kafka_config(), "bootstrap.servers": bootstrap,
        # The same id after a restart fences the previous instance and aborts its open
        # transaction.
        "transactional.id": os.environ["LABKIT_TRANSACTIONAL_ID"],
    })
    producer.init_transactions()
    consumer.subscribe([os.environ["LABKIT_INPUT_TOPIC"]])
    out = os.environ["LABKIT_OUTPUT_TOPIC"]
    while True:
        msgs = [m for m in consumer.consume(batch, timeout=0.5) if m.error() is None]
        if not msgs:
            continue
        producer.begin_transaction()
        try:
            for m in msgs:
                record = json.loads(m.value())
                time.sleep(work_s)
                record["processed"] = True  # the transformation; the id is kept
                producer.produce(out, key=m.key(), value=json.dumps(record).encode())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata())
            producer.commit_transaction()
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise  # fatal (e.g. fenced): let the supervisor restart us
            producer.abort_transaction()
            # Rewind to what was committed, so the aborted batch is processed again.
            committed = consumer.committed(consumer.assignment())
            for tp in committed:
                consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))


if __name__ == "__main__":
    main()
