"""09b · on the wire: the exercise check.

Kafka's Java producer (4.x) speaks transaction version 2: every EndTxn bumps the producer
epoch and the marker is written with the new one. The learner predicts the epoch of the
last COMMIT marker when the Java copier copies 30 records in transactions of 10 with a
fresh transactional.id; the check runs the real copier and reads the marker's epoch from
the partition's log.
"""
from __future__ import annotations

import uuid

from labkit.exercises import Verdict, check, exercise, unanswered

RECORDS, TRANSACTION_SIZE = 30, 10


def last_marker_epoch(bootstrap: str) -> int:
    """Run the Java copier (30 records, transactions of 10, a fresh transactional.id) and
    return the epoch of the last marker on its output partition."""
    from labkit.kafka import topics
    from labkit.pipelines import data
    from labkit.torture import apps
    from labkit.kafka.inspect import describe_topic

    name = f"wire-check-{uuid.uuid4().hex[:8]}"
    try:
        code, _ = apps.copy_with_java(bootstrap, name, data.generate(RECORDS),
                                      transaction_size=TRANSACTION_SIZE)
        if code != 0:
            raise RuntimeError(f"the Java copier exited with {code}: `labkit doctor` checks Java")
        return int(describe_topic(bootstrap, f"{name}-out").transactions_frame()["marker epoch"].iloc[-1])
    finally:
        topics.delete(bootstrap, f"{name}-in", f"{name}-out")


def judge(epoch: int, measured: int) -> Verdict:
    return check(epoch == measured,
                 f"the last COMMIT marker carries epoch {measured}: each of the "
                 f"{RECORDS // TRANSACTION_SIZE} transactions' EndTxn bumped the epoch once, and "
                 "the marker is written with the new one.",
                 f"the last marker does not carry epoch {epoch}. With transaction version 2, "
                 "which epoch does the first transaction's data use, and what does each "
                 "EndTxn do to it? Count the transactions.")


@exercise("09b_on_the_wire")
def check_last_marker_epoch(bootstrap: str, epoch: int | None) -> Verdict:
    """09b: predict the epoch of the Java copier's last marker; the check runs the copier."""
    if unanswered(epoch):
        return check(False, "", "fill in my_epoch, then run this cell again.")
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        return check(False, "", "my_epoch must be a whole number.")
    return judge(epoch, last_marker_epoch(bootstrap))
