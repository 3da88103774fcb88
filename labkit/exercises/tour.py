"""00 · tour: the exercise check."""
from __future__ import annotations

from labkit.exercises import Verdict, check, unanswered


def check_tour(bootstrap: str, topic: str, partition: int | None, offset: int | None) -> Verdict:
    """00 · tour: predict partition and offset of the last of three more acct-03 payments.

    The check really produces the three records and compares with what the broker assigned.
    """
    if unanswered(partition) or unanswered(offset):
        return check(False, "", "fill in my_partition and my_offset, then run this cell again.")
    from confluent_kafka import Producer

    acks: list[tuple[int, int]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(3):
        producer.produce(topic, key="acct-03", value=b'{"amount": 1}',
                         on_delivery=lambda err, msg: acks.append((msg.partition(), msg.offset())))
    producer.flush(10)
    got = acks[-1]
    return check((partition, offset) == got,
                 f"the broker put it at partition {got[0]}, offset {got[1]}: same key, same "
                 "partition, and offsets count on from the high watermark.",
                 f"the broker put it at partition {got[0]}, offset {got[1]}. Same key means same "
                 "partition; the offset counts on from that partition's high watermark. "
                 "(Re-running adds three more records, so recompute first.)")
