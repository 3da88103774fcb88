"""04 · transactions: the exercise check."""
from __future__ import annotations

import uuid

from labkit.exercises import Verdict, check, exercise, unanswered


def run_three_transactions(bootstrap: str, topic: str) -> tuple[int, int]:
    """On a fresh one-partition ``topic``: commit 3 records, abort 2 (flushed), commit 1.

    Returns (high watermark, offset of the last record) as the broker reports them.
    """
    from confluent_kafka import Producer

    from labkit.kafka import names, topics
    from labkit.kafka.clientlog import client_config
    from labkit.kafka.inspect import Inspector

    topic = names.topic(topic)  # the producer below is given the broker's name (labkit.kafka.names)
    topics.create(bootstrap, topic)
    producer = Producer(client_config({"bootstrap.servers": bootstrap,
                                       "transactional.id": f"{topic}-txn"}))
    producer.init_transactions(30)
    acks: list[int] = []
    for n, commit in ((3, True), (2, False), (1, True)):
        producer.begin_transaction()
        for i in range(n):
            producer.produce(topic, key="acct-01", value=topics.encode({"amount": i}),
                             on_delivery=lambda err, msg: acks.append(msg.offset()))
        producer.flush(30)  # abort_transaction() would drop unsent records: send them first
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    with Inspector(bootstrap) as inspector:
        offsets = inspector.settled_offsets(topic)[0]  # the last COMMIT marker included
    return offsets.high_watermark, acks[-1]


@exercise("04_transactions")
def check_transactions(bootstrap: str, high_watermark: int | None,
                       last_offset: int | None) -> Verdict:
    """04 · transactions: predict the high watermark and the last record's offset after
    commit(3 records), abort(2 records), commit(1 record) on an empty partition.

    The check really runs the three transactions on a fresh topic and asks the broker.
    """
    if unanswered(high_watermark) or unanswered(last_offset):
        return check(False, "", "fill in my_high_watermark and my_last_offset, then run this "
                     "cell again. Count the data records, and one offset per marker.")
    hw, last = run_three_transactions(bootstrap, f"ex04-{uuid.uuid4().hex[:8]}")
    if (high_watermark, last_offset) == (hw, last):
        return check(True, f"the broker says high watermark {hw}, last record at offset {last}: "
                           "3 + 2 + 1 data records and 3 markers (COMMIT, ABORT, COMMIT).", "")
    right = [name for name, mine, got in (("high watermark", high_watermark, hw),
                                          ("last offset", last_offset, last)) if mine == got]
    return check(False, "", (f"your {right[0]} is right, the other is not. " if right else
                             "neither number is right yet. ")
                 + "Every transaction ends with one marker per partition, and the aborted "
                 "records stay in the log: they take offsets too. Offsets start at 0.")
