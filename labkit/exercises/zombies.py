"""06 · zombies: the exercise check."""
from __future__ import annotations

from labkit.exercises import Verdict, check, unanswered


def start_instance(bootstrap: str, topic: str, transactional_id: str) -> int:
    """Start one more instance with ``transactional_id``, commit one record with it and
    return the epoch the partition leader saw it write with."""
    from labkit.inspect import Inspector
    from labkit.pipelines.txn import Transactions

    txn = Transactions(bootstrap, transactional_id)
    txn.begin()
    txn.produce(topic, "check", {"id": "exercise-check", "key": "check"})
    txn.commit()
    with Inspector(bootstrap) as inspector:
        return max(s.producer_epoch for s in inspector.producers(topic))


def check_next_epoch(bootstrap: str, topic: str, transactional_id: str,
                     epoch: int | None) -> Verdict:
    """06: predict the epoch of a third instance with the same transactional.id (the second
    one is idle: no open transaction). The check really starts it and asks the broker."""
    if unanswered(epoch):
        return check(False, "", "fill in my_epoch, then run this cell again. Look at the epoch "
                     "the second instance writes with, and at what it has open right now.")
    got = start_instance(bootstrap, topic, transactional_id)
    return check(epoch == got,
                 f"the third instance writes with epoch {got}: one bump, because nothing was "
                 "open to abort (the double bump of step 2 came from aborting the zombie's "
                 "transaction).",
                 f"the new instance does not write with epoch {epoch}. How many times does "
                 "init_transactions() bump the epoch when the previous instance has nothing "
                 "open to abort? (Every run of this cell starts one more instance, so the "
                 "epoch moves on with each run: count the runs in.)")
