"""06 · zombies: the exercise check."""
from __future__ import annotations

from labkit.exercises import Verdict, check, unanswered


def start_instance(bootstrap: str, topic: str, transactional_id: str) -> int:
    """Start one more instance with ``transactional_id``, commit one record with it and
    return the epoch the partition leader saw it write with."""
    from labkit import names
    from labkit.inspect import Inspector
    from labkit.pipelines.txn import Transactions

    topic = names.topic(topic)  # Transactions.produce is given the broker's name (labkit.names)
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


GROUP_RECORDS, GROUP_INSTANCES, GROUP_PARTITIONS = 180, 3, 6


def check_group_duplicates(bootstrap: str, duplicates: int | None) -> Verdict:
    """06: predict the duplicates when one of three at_least_once instances is killed at
    after-process-before-commit on its second batch. The check runs it and audits."""
    from labkit import scenarios

    if unanswered(duplicates):
        return check(False, "", "fill in my_duplicates, then run this cell again.")
    if isinstance(duplicates, bool) or not isinstance(duplicates, int):
        return check(False, "", "my_duplicates must be a whole number of payments.")
    run = scenarios.run_detailed("consume-transform-produce", "at_least_once",
                                 crash_at="after-process-before-commit",
                                 records=GROUP_RECORDS, bootstrap=bootstrap,
                                 instances=GROUP_INSTANCES, partitions=GROUP_PARTITIONS)
    got = run.report.duplicated
    return check(duplicates == got,
                 f"the audit counts {got} duplicates: the batch instance 0 had written but "
                 "not committed; its partitions' next owner read it again from the committed "
                 "offsets. A group does not change what at_least_once means.",
                 f"the audit does not count {duplicates}. What had instance 0 written, and "
                 "not yet committed, when it died? Where does the member that takes over its "
                 "partitions start reading? (Batches hold 10 records.)")
