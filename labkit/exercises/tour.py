"""00 · tour: the exercise check."""
from __future__ import annotations

import uuid

from labkit.exercises import Verdict, check, exercise, unanswered

KEY = "acct-03"


def produce_three_more(bootstrap: str, topic: str) -> tuple[int, int]:
    """(partition, offset) the broker gives the last of three more ``KEY`` records after
    the records ``topic`` holds now, measured on a copy so that ``topic`` stays as it is.

    The copy has the same partitions and every record of ``topic`` at the same partition
    and offset; the three new records are then keyed, as the notebook's producer does.
    """
    from confluent_kafka import Producer

    from labkit.kafka import names, topics
    from labkit.kafka.clientlog import client_config

    topic = names.topic(topic)  # the broker's name, so the copy's is too (labkit.kafka.names)
    copy = f"{topic}-check-{uuid.uuid4().hex[:6]}"
    topics.create(bootstrap, copy, partitions=len(topics.partitions_of(bootstrap, topic)))
    producer = Producer(client_config({"bootstrap.servers": bootstrap,
                                       "enable.idempotence": True}))
    for r in topics.read(bootstrap, topic):  # in (partition, offset) order
        producer.produce(copy, partition=r.partition, key=r.key, value=topics.encode(r.value))
    producer.flush(10)
    acks: list[tuple[int, int]] = []
    for _ in range(3):
        producer.produce(copy, key=KEY, value=topics.encode({"amount": 1}),
                         on_delivery=lambda err, msg: acks.append((msg.partition(), msg.offset())))
    producer.flush(10)
    return acks[-1]


@exercise("00_tour")
def check_tour(bootstrap: str, topic: str, partition: int | None, offset: int | None) -> Verdict:
    """00 · tour: predict partition and offset of the last of three more acct-03 payments.

    The check really produces the three records, on a copy of ``topic`` (so running it
    again asks the same question), and compares with what the broker assigned.
    """
    if unanswered(partition) or unanswered(offset):
        return check(False, "", "fill in my_partition and my_offset, then run this cell again.")
    got_partition, got_offset = produce_three_more(bootstrap, topic)
    if partition != got_partition:
        return check(False, "", f"{KEY} does not go to partition {partition}. Same key, same "
                                "partition: which one did its first payment land in (section 3)?")
    return check(offset == got_offset,
                 f"the broker put it at partition {got_partition}, offset {got_offset}: same key, "
                 "same partition, and offsets count on from the high watermark.",
                 f"right partition, but not offset {offset}. The three records get the next "
                 "offsets of that partition: where does it end now (section 5), and which of "
                 "the three is the last?")
