"""05 · consume-transform-produce: the exercise check.

The learner writes ``rewind(consumer, batch)``: what the loop does after it aborted a
transaction, so that the aborted batch is read again. The check runs it after a real
aborted transaction whose batch was read from three partitions, each of which the group had
committed to a different offset (a batch spans partitions whenever the consumer hands over
records of several; the judge's runs meet one only when an abort happens to fall on it, so
the check makes it happen every time). Then it reads on with the learner's consumer and
compares, partition by partition, where reading resumed with where the aborted transaction
began: later loses records, earlier charges committed ones twice.
"""
from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Callable

from labkit.exercises import Verdict, check, exercise

PARTITIONS = 3
RECORDS_PER_PARTITION = 6
# Where the group's last committed transaction left each partition: the aborted batch read
# each from there (different on each, so one partition's offset fits no other).
COMMITTED = {0: 2, 1: 0, 2: 4}
READ_S = 20.0  # at most this long to read the batch, or to read on after the rewind
QUIET_S = 3.0  # after the rewind, no partition started for this long: the rest read nothing
HINT = "Which partitions did the aborted batch read, and where did it begin on each?"


def _validate(rewind: object) -> str | None:
    if not callable(rewind):
        return f"pass your function itself (rewind), not {type(rewind).__name__}"
    try:
        inspect.signature(rewind).bind(object(), [])
    except TypeError:
        return "rewind must take two arguments, (consumer, batch), as the loop calls it"
    return None


def _read(consumer, count: int | None = None) -> list:
    """Records from ``consumer``: ``count`` of them, or (``count`` None) until each partition
    has given one or none has started for QUIET_S (the input is all in the log: a partition
    read again gives its records in the same fetch as the others, one left at its end gives
    none); READ_S at most."""
    got, partitions = [], set()
    started = last_new = time.monotonic()
    while time.monotonic() - started < READ_S:
        for msg in consumer.consume(50, timeout=0.2):
            if msg.error() is None:
                got.append(msg)
                if msg.partition() not in partitions:
                    partitions.add(msg.partition())
                    last_new = time.monotonic()
        if count is not None:
            if len(got) >= count:
                break
        elif len(partitions) == PARTITIONS or time.monotonic() - last_new >= QUIET_S:
            break
    return got


def rewound(bootstrap: str, rewind: Callable) -> tuple[dict[int, int | None], list[int]]:
    """Run ``rewind`` after an aborted transaction whose batch spans every partition; return
    where reading resumed on each partition (None: nothing more was read from it) and the
    partitions of the batch in the order the learner's rewind got them (partition order)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from labkit.kafka import names, topics
    from labkit.kafka.clientlog import client_config

    base = f"rewind-check-{uuid.uuid4().hex[:8]}"
    source, sink = names.topic(f"{base}-in"), names.topic(f"{base}-out")
    topics.create(bootstrap, source, partitions=PARTITIONS)
    topics.create(bootstrap, sink)
    consumer = producer = None
    try:
        writer = Producer(client_config({"bootstrap.servers": bootstrap, "enable.idempotence": True}))
        for p in range(PARTITIONS):
            for i in range(RECORDS_PER_PARTITION):
                writer.produce(source, key=f"p{p}", value=topics.encode({"id": f"p{p}-{i}"}),
                               partition=p)
        if writer.flush(30):
            raise RuntimeError("the check could not write its input")
        consumer = Consumer(client_config({
            "bootstrap.servers": bootstrap, "group.id": base, "isolation.level": "read_committed",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50}))
        consumer.commit(offsets=[TopicPartition(source, p, o) for p, o in COMMITTED.items()],
                        asynchronous=False)  # where the last committed transaction left it
        consumer.subscribe([source])
        expected = sum(RECORDS_PER_PARTITION - o for o in COMMITTED.values())
        # in partition order: the fetches' order varies from run to run, and the hint that
        # names it should not
        batch = sorted(_read(consumer, expected), key=lambda m: (m.partition(), m.offset()))
        if len(batch) < expected:
            raise RuntimeError(f"the check read {len(batch)} of its {expected} records")
        producer = Producer(client_config({"bootstrap.servers": bootstrap,
                                           "transactional.id": base,
                                           "connections.max.idle.ms": 5000}))
        producer.init_transactions(30)
        producer.begin_transaction()
        for msg in batch:
            producer.produce(sink, key=msg.key(), value=msg.value())
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        producer.abort_transaction(30)  # the transaction the loop gave up
        rewind(consumer, batch)  # the learner's code; what it raises is the verdict's
        again = _read(consumer)
        resumed: dict[int, int | None] = {p: None for p in range(PARTITIONS)}
        for msg in again:
            if resumed[msg.partition()] is None:
                resumed[msg.partition()] = msg.offset()
        order = list(dict.fromkeys(m.partition() for m in batch))
        return resumed, order
    finally:
        if consumer is not None:
            consumer.close()
        topics.delete(bootstrap, source, sink)


def findings(resumed: dict[int, int | None]) -> list[str]:
    """Per partition, what reading on from there would do to the aborted batch's records."""
    out = []
    for p, began in COMMITTED.items():
        at = resumed[p]
        if at == began:
            continue
        if at is None or at > began:
            end = RECORDS_PER_PARTITION if at is None else at
            out.append(f"partition {p} resumed at offset {end}, but the aborted transaction "
                       f"began there at {began}: offsets {began}-{end - 1} would never be "
                       "processed (lost)")
        else:
            out.append(f"partition {p} resumed at offset {at}, before its committed offset "
                       f"{began}: offsets {at}-{began - 1} would be processed again (charged "
                       "twice)")
    return out


@exercise("05_consume_transform_produce")
def check_rewind(bootstrap: str, rewind: Callable) -> Verdict:
    """05: the learner's ``rewind(consumer, batch)`` after a real aborted transaction whose
    batch spans three partitions: reading must resume on each where the batch began."""
    problem = _validate(rewind)
    if problem:
        return check(False, "", problem + ".")
    from confluent_kafka import KafkaException

    from labkit.progress import status

    with status("Checking rewind: a batch from 3 partitions, its transaction aborted"):
        try:
            resumed, order = rewound(bootstrap, rewind)
        except (KafkaException, TypeError, ValueError, AttributeError) as exc:
            return check(False, "", f"rewind raised {type(exc).__name__}: {exc}. " + HINT)
    found = findings(resumed)
    began = ", ".join(f"partition {p} at {o}" for p, o in COMMITTED.items())
    return check(not found,
                 f"after the abort, each partition the batch came from ({began}) was read "
                 "again from where the transaction began: nothing lost, nothing twice.",
                 f"the batch came from partitions {', '.join(map(str, order))} (in that "
                 f"order). {'; '.join(found)}. " + HINT)
