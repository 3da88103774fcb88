"""The exactly-once consume-transform-produce loop as production runs it: any number of
partitions, several instances in one group, rebalances (both group protocols), abortable and
fatal errors, a zombie, a coordinator that moves. It is the lab's one loop: notebook 05
grows it step by step and shows it whole (section 7, this code line for line), the capstone's
solution is it, and the judge runs it when no loop is given.

What makes it hold beyond one partition and one instance:

- the offsets sent with each transaction are the consumer's **position on every assigned
  partition** (the next record to read; nothing for a partition that delivered nothing
  since it was assigned or rewound), with the consumer's **group metadata** (KIP-447), so a
  zombie's late commit is refused by the group coordinator;
- a **fatal** error means this instance has been fenced (a newer one has its
  transactional.id, or its group.instance.id): it must stop, and a supervisor starts it
  again (``init_transactions`` fences whatever is left of it); any other error inside the
  transaction (abortable: a refused record, offsets refused to a zombie; or ``produce()``
  refused because the transaction already failed) aborts it and **rewinds every assigned
  partition** to its committed offset, so the batch is read again; ``commit_transaction``'s
  retriable errors are retried;
- partitions move only inside ``consume()``, between two transactions: none is open with
  them;
- every call is **bounded** by a timeout;
- told to stop (SIGTERM: a scale-down, a deploy), it finishes its batch and leaves the group
  (``close``): a transaction it left open would hold back every read_committed reader of
  its partitions until its ``transaction.timeout.ms``;
- the settings that decide whether it survives are written down: static membership (a
  restarted instance takes its partitions back at once), a session short enough that a
  dead member's partitions move on in seconds, the transaction timeout, and two librdkafka
  workarounds for ``send_offsets_to_transaction`` blocking past its timeout (librdkafka
  #5456, #5511): idle connections closed, so a broker change ends the wait; and no
  re-bootstrap, which on losing its last broker connection (one broker, one dropped ack)
  discards the broker the wait is for.

It runs until it is stopped, as a streaming service does.
"""
import json
import signal

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)

from labkit.kafka.clientlog import client_config  # how to reach your cluster
from labkit.faults.crashpoints import crash_point
from labkit.pipelines.ctp import transform  # the card fee: 2.9 % + 30 cents


def rewind(consumer, batch):
    """After an abort: every partition this instance holds back to its committed offset,
    where the aborted transaction began on it, so the batch is read again."""
    for tp in consumer.committed(consumer.assignment(), timeout=30):
        start = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING  # nothing committed yet
        consumer.seek(TopicPartition(tp.topic, tp.partition, start))


def commit(producer, attempts=5):
    for attempt in range(attempts):
        try:
            return producer.commit_transaction(30)
        except KafkaException as error:
            if not error.args[0].retriable() or attempt == attempts - 1:
                raise


def fee_service(
        bootstrap, input_topic, output_topic, group_id, transactional_id, instance_id,
        group_protocol="classic"):
    consumer = Consumer(client_config({
        "bootstrap.servers": bootstrap, "group.id": group_id,
        "group.protocol": group_protocol,  # "classic", or "consumer" (KIP-848)
        "group.instance.id": instance_id,  # (1)
        **({"session.timeout.ms": 10000} if group_protocol == "classic" else {}),  # (1)
        "isolation.level": "read_committed",  # never read records of aborted transactions
        "enable.auto.commit": False,  # the offsets go into the transaction instead
        "auto.offset.reset": "earliest"}))
    producer = Producer(client_config({
        "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
        "transaction.timeout.ms": 60000,  # (2)
        "connections.max.idle.ms": 5000,  # (3)
        "metadata.recovery.strategy": "none"}))  # (4)
    producer.init_transactions(30)  # fences an older instance and aborts what it left open
    stopping = []  # SIGTERM: finish the batch, then stop
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    consumer.subscribe([input_topic])
    while not stopping:
        batch = []
        for msg in consumer.consume(10, timeout=1.0):
            if msg.error() is None:
                batch.append(msg)
            elif msg.error().code() == KafkaError._FATAL:  # e.g. our group.instance.id taken
                raise KafkaException(msg.error())
        if not batch:
            continue
        crash_point("after-poll-before-process")
        producer.begin_transaction()
        try:
            for n, msg in enumerate(batch):
                payment = transform(json.loads(msg.value()))
                producer.produce(output_topic, key=msg.key(), value=json.dumps(payment))
                if n == len(batch) // 2 - 1:
                    producer.flush(30)
                    crash_point("mid-batch")
            crash_point("after-produce-before-flush")
            producer.flush(30)
            crash_point("in-transaction-before-commit")
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()),  # next to read, every partition
                consumer.consumer_group_metadata(), 30)
            crash_point("after-send-offsets-before-commit")
            commit(producer)  # again while its error is retriable
        except KafkaException as error:
            if error.args[0].fatal():
                raise  # fenced by a newer instance with our transactional.id: stop
            # abortable, or any other error inside the transaction: give the batch up
            producer.abort_transaction(30)  # drop the output and the offsets...
            rewind(consumer, batch)  # ...and read the batch again
            continue
        crash_point("after-commit")
    consumer.close()
