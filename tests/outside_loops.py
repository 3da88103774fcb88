"""Consume-transform-produce loops written outside the lab: plain confluent-kafka and the
function's arguments, no labkit import (no crash points, no lab settings). The judge must
judge them as it judges the lab's own: a right one passes with Kafka's default client
settings (dynamic membership, a 45 s session: slow, not stalled) and with the lab's; a
commit-first one fails with its finding.

The judge runs each function from this file's text, as it runs a notebook cell.
"""
import json

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

TIMEOUT_S = 30


def _fee(value: bytes) -> str:
    payment = json.loads(value)
    payment["fee_cents"] = round(payment["amount_cents"] * 0.029) + 30
    return json.dumps(payment)


def _transactional(consumer: Consumer, producer: Producer, input_topic: str,
                   output_topic: str, flush: bool) -> None:
    """Each batch in a transaction with its offsets; an error that is not fatal aborts it
    and reads the batch again; a fatal one (fenced) ends the process."""
    producer.init_transactions(TIMEOUT_S)
    consumer.subscribe([input_topic])
    while True:
        messages = consumer.consume(50, timeout=1.0)
        for m in messages:
            if m.error() is not None and m.error().fatal():
                raise KafkaException(m.error())
        batch = [m for m in messages if m.error() is None]
        if not batch:
            continue
        producer.begin_transaction()
        try:
            for m in batch:
                producer.produce(output_topic, key=m.key(), value=_fee(m.value()))
            if flush:
                producer.flush(TIMEOUT_S)
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), TIMEOUT_S)
            producer.commit_transaction(TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].fatal():
                raise
            producer.abort_transaction(TIMEOUT_S)
            for tp in consumer.committed(consumer.assignment(), timeout=TIMEOUT_S):
                consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))


def exactly_once_defaults(bootstrap, input_topic, output_topic, group_id, transactional_id):
    """Kafka's defaults but what correctness needs: no auto-commit, from the earliest."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    _transactional(consumer, producer, input_topic, output_topic, flush=False)


def exactly_once_lab_settings(bootstrap, input_topic, output_topic, group_id,
                              transactional_id, instance_id, flush=False):
    """The same loop with the settings the lab's own loops use: static membership, a 10 s
    session, idle connections closed after 5 s (librdkafka #5456)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id,
                         "group.instance.id": instance_id, "session.timeout.ms": 10000,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "connections.max.idle.ms": 5000})
    _transactional(consumer, producer, input_topic, output_topic, flush=flush)


def exactly_once_flushing(bootstrap, input_topic, output_topic, group_id, transactional_id,
                          instance_id):
    """The same, its records flushed before the offsets are sent."""
    exactly_once_lab_settings(bootstrap, input_topic, output_topic, group_id,
                              transactional_id, instance_id, flush=True)


def commit_first(bootstrap, input_topic, output_topic, group_id):
    """Offsets committed as soon as the batch is read, then the output written: a crash in
    between loses the batch."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    consumer.subscribe([input_topic])
    while True:
        batch = [m for m in consumer.consume(50, timeout=1.0) if m.error() is None]
        if not batch:
            continue
        consumer.commit(asynchronous=False)
        for m in batch:
            producer.produce(output_topic, key=m.key(), value=_fee(m.value()))
        producer.flush(TIMEOUT_S)
