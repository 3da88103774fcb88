"""A consume-transform-produce app written the way a user would, with plain confluent-kafka.

It reads LABKIT_INPUT_TOPIC, adds a field to each record and writes it to
LABKIT_OUTPUT_TOPIC. Output records and the consumed offsets are committed in one
transaction (KIP-447: the offsets carry the consumer's group metadata), so a crash anywhere
replays exactly the records whose output was aborted: exactly-once.

    labkit torture --records 400 --kills 3 -- python examples/torture/exactly_once_app.py

It runs until it is stopped, like a real streaming app. ``--work-ms`` is the processing
time per record (a real app does something per record; it also gives the harness's kills
something to interrupt). ``--kafka-defaults`` leaves out the two settings below that are
not Kafka's defaults (static membership, the idle-connection workaround): a restarted
instance then waits for its dead predecessor's session (45 s), slower, still exact:

    labkit torture --schedule production --instances 2 --kills 0 -- \
        python examples/torture/exactly_once_app.py --kafka-defaults

``--hang-after N`` makes it hang like librdkafka's send_offsets_to_transaction() blocking far
past its timeout (librdkafka #5456, #5511): after N committed transactions, the next one
writes its output and then sleeps forever, alive, before sending its offsets. With
``--hang-once FILE`` only the start that creates FILE hangs (the restarted app runs on):

    labkit torture --kills 0 --stall-s 10 -- python examples/torture/exactly_once_app.py \
        --hang-after 3 --hang-once /tmp/hung-once
"""
import argparse
import json
import os
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from kafka_config import kafka_config  # LABKIT_KAFKA_CONFIG: TLS and credentials, when set


def hang_here(once_marker: str | None) -> bool:
    """Hang now? Always without a marker; with one, only if this start creates it."""
    if once_marker is None:
        return True
    try:
        open(once_marker, "x").close()
        return True
    except FileExistsError:
        return False


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--work-ms", type=float, default=0.0, help="processing time per record")
    args.add_argument("--batch", type=int, default=20, help="records per transaction")
    args.add_argument("--hang-after", type=int, default=None,
                      help="hang forever (alive) inside the transaction after this many commits")
    args.add_argument("--hang-once", default=None, metavar="FILE",
                      help="with --hang-after: only the start that creates FILE hangs")
    args.add_argument("--kafka-defaults", action="store_true",
                      help="no static membership, no idle-connection workaround")
    opts = args.parse_args()
    work_s, batch = opts.work_ms / 1000, opts.batch
    bootstrap = os.environ["LABKIT_BOOTSTRAP"]
    group = os.environ["LABKIT_GROUP_ID"]
    tuned = {} if opts.kafka_defaults else {
        # Static membership: a restarted instance takes its predecessor's place at once
        # instead of waiting for the dead one's session to time out.
        "group.instance.id": os.environ.get("LABKIT_INSTANCE_ID", f"{group}-1"),
        # librdkafka 2.16 can block send_offsets_to_transaction() past its timeout once the
        # group's coordinator left the cluster, until some connection opens or closes
        # (librdkafka issues 5511, 5456): closing idle connections bounds that wait.
        "connections.max.idle.ms": 5000}
    consumer = Consumer({
        **kafka_config(), "bootstrap.servers": bootstrap, "group.id": group,
        **{k: v for k, v in tuned.items() if k.startswith("group.")},
        "enable.auto.commit": False,  # offsets are committed inside the transaction
        "isolation.level": "read_committed",  # never process another app's aborted output
        "auto.offset.reset": "earliest",
    })
    producer = Producer({
        **kafka_config(), "bootstrap.servers": bootstrap,
        # The same id after a restart fences the previous instance and aborts its open
        # transaction.
        "transactional.id": os.environ["LABKIT_TRANSACTIONAL_ID"],
        **{k: v for k, v in tuned.items() if k.startswith("connections.")},
    })
    producer.init_transactions(60)
    consumer.subscribe([os.environ["LABKIT_INPUT_TOPIC"]])
    out = os.environ["LABKIT_OUTPUT_TOPIC"]
    committed_txns = 0
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
            if committed_txns == opts.hang_after and hang_here(opts.hang_once):
                producer.flush(10)  # the output is in the log, in a transaction left open
                print(f"hanging after {committed_txns} transactions (--hang-after)", flush=True)
                while True:
                    time.sleep(3600)
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 60)
            producer.commit_transaction(60)
            committed_txns += 1
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise  # fatal (e.g. fenced): let the supervisor restart us
            producer.abort_transaction(60)
            # Rewind to what was committed, so the aborted batch is processed again.
            committed = consumer.committed(consumer.assignment(), timeout=30)
            for tp in committed:
                consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))


if __name__ == "__main__":
    main()
