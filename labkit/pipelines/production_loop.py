"""The exactly-once consume-transform-produce loop as production runs it: any number of
partitions, several instances in one group, rebalances, abortable and fatal errors, a
zombie, a coordinator that moves. The lab's reference for the judge (notebook 05 builds the
same loop step by step; the capstone's solution is this loop).

What makes it hold beyond one partition and one instance:

- the offsets sent with each transaction are the consumer's **position on every assigned
  partition**, not the last record's offset plus one (a batch spans partitions);
- a **fatal** error means this instance has been fenced (a newer one has its
  transactional.id): it must stop, and a supervisor starts it again (``init_transactions``
  fences whatever is left of it); any other error inside the transaction (abortable: a
  refused record, offsets refused to a zombie; or ``produce()`` refused because the
  transaction already failed) aborts it and **rewinds every assigned partition** to its
  committed offset, so the batch is read again; ``commit_transaction``'s retriable errors
  are retried;
- partitions revoked (or lost) while a transaction is open: it is aborted, so what this
  instance wrote from them is never committed after another instance took them over; and
  the offsets carry the consumer's **group metadata** (KIP-447), so a zombie's late commit is
  refused by the group coordinator;
- every call is **bounded** by a timeout;
- told to stop (SIGTERM: a scale-down, a deploy), it finishes its batch and leaves the group
  (``close``): a transaction it left open would hold back every read_committed reader of
  its partitions until its ``transaction.timeout.ms``;
- the settings that decide whether it survives are written down: static membership (a
  restarted instance takes its partitions back at once), a session short enough that a
  dead member's partitions move on in seconds, and librdkafka's idle-connection workaround
  for ``send_offsets_to_transaction`` blocking past its timeout (librdkafka #5456, #5511).

It runs until it is stopped, as a streaming service does.
"""
from __future__ import annotations

import json
import signal

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from labkit.faults.crashpoints import crash_point
from labkit.pipelines.ctp import transform

TIMEOUT_S = 30  # every call to the clients is bounded


def fee_service(bootstrap: str, input_topic: str, output_topic: str, group_id: str,
                transactional_id: str, instance_id: str, group_protocol: str = "classic") -> None:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group_id, "group.protocol": group_protocol,
        # static membership: a restarted instance takes its partitions back at once
        "group.instance.id": instance_id,
        # a dead or frozen member keeps its partitions this long (classic protocol; the
        # consumer protocol's session is the broker's group.consumer.session.timeout.ms)
        **({"session.timeout.ms": 10000} if group_protocol == "classic" else {}),
        "isolation.level": "read_committed",  # never read an aborted transaction's records
        "enable.auto.commit": False,  # offsets go with the transaction, nowhere else
        "auto.offset.reset": "earliest"})
    producer = Producer({
        "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
        # librdkafka's send_offsets_to_transaction() can wait past its timeout after a broker
        # change until some connection changes state; idle connections closed sooner give it
        # one (librdkafka #5456, #5511)
        "connections.max.idle.ms": 5000})
    producer.init_transactions(TIMEOUT_S)  # fences a predecessor, aborts what it left open
    in_transaction = False

    def abort() -> None:
        nonlocal in_transaction
        producer.abort_transaction(TIMEOUT_S)
        in_transaction = False

    def rewind() -> None:
        """Every assigned partition back to its committed offset: the batch is read again."""
        for tp in consumer.committed(consumer.assignment(), timeout=TIMEOUT_S):
            start = tp.offset if tp.offset >= 0 else 0  # nothing committed yet: from the start
            consumer.seek(TopicPartition(tp.topic, tp.partition, start))

    def on_revoke(_consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        if in_transaction:  # what we wrote from them must not be committed by us later
            abort()

    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    consumer.subscribe([input_topic], on_revoke=on_revoke, on_lost=on_revoke)
    while not stopping:
        batch = []
        for msg in consumer.consume(100, timeout=1.0):
            if msg.error() is None:
                batch.append(msg)
            elif msg.error().code() == KafkaError._FATAL:  # e.g. another member has our
                # group.instance.id (the consumer protocol's UNRELEASED_INSTANCE_ID). The
                # consumer reports its fatal error as an event of this code, whose own
                # fatal() is False: checking fatal() alone, the loop went on consuming
                # nothing until the judge called it stalled.
                raise KafkaException(msg.error())
        if not batch:
            continue
        crash_point("after-poll-before-process")
        producer.begin_transaction()
        in_transaction = True
        try:
            for n, msg in enumerate(batch):
                payment = transform(json.loads(msg.value()))
                producer.produce(output_topic, key=msg.key(), value=json.dumps(payment))
                if n == len(batch) // 2:
                    producer.flush(TIMEOUT_S)
                    crash_point("mid-batch")
            crash_point("after-produce-before-flush")
            producer.flush(TIMEOUT_S)
            crash_point("in-transaction-before-commit")
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), TIMEOUT_S)
            crash_point("after-send-offsets-before-commit")
            commit(producer)
            in_transaction = False
        except KafkaException as exc:
            if exc.args[0].fatal():
                raise  # fenced by a newer instance: stop; a supervisor restarts us
            # abortable (a refused record, offsets refused to a zombie, a produce() in a
            # transaction already failed): abort, and read the batch again
            abort()
            rewind()
            continue
        crash_point("after-commit")
    consumer.close()  # leaves the group: its partitions move to the others at once


def commit(producer: Producer, attempts: int = 5) -> None:
    """commit_transaction, called again while its error is retriable (a timeout, a
    coordinator moving), ``attempts`` times at most."""
    for attempt in range(attempts):
        try:
            producer.commit_transaction(TIMEOUT_S)
            return
        except KafkaException as exc:
            if not exc.args[0].retriable() or attempt == attempts - 1:
                raise
