"""06 · zombies: the exercise check."""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered


def replay_takeover(bootstrap: str) -> tuple[int, int]:
    """Sections 1-2 again, on a topic and a transactional.id of their own: A opens a
    transaction and freezes, B takes over (aborting A's) and commits, then a third instance
    starts while B is idle and commits one record. Returns the epochs the partition leader
    saw B and the third instance write with. Fresh names each time: the answer does not
    move when the check is run again."""
    import uuid

    from labkit.kafka import names, topics
    from labkit.kafka.inspect import Inspector
    from labkit.pipelines.guarantee import transactions

    topic = f"zombie-check-{uuid.uuid4().hex[:8]}"
    topics.create(bootstrap, topic)
    on_broker, app = names.topic(topic), f"{topic}-app"  # produce takes the broker's name

    def leader_epoch(inspector: Inspector) -> int:
        return max(s.producer_epoch for s in inspector.producers(on_broker))

    try:
        frozen = transactions(bootstrap, app)
        frozen.begin()
        frozen.produce(on_broker, "acct", {"id": "a-1", "key": "acct"})
        frozen.flush(60)
        epochs = []
        with Inspector(bootstrap) as inspector:
            for instance in ("b", "c"):  # B takes over, then the third while B is idle
                txn = transactions(bootstrap, app)
                txn.begin()
                txn.produce(on_broker, "acct", {"id": f"{instance}-1", "key": "acct"})
                txn.commit()
                epochs.append(leader_epoch(inspector))
        return epochs[0], epochs[1]
    finally:
        topics.delete(bootstrap, topic)


@exercise("06_zombies", "1")
def check_next_epoch(bootstrap: str, epoch: int | None) -> Verdict:
    """06: predict the epoch of a third instance with the same transactional.id (the second
    one is idle: no open transaction). The check replays the takeover and asks the broker."""
    if unanswered(epoch):
        return check(False, "", "fill in my_epoch, then run this cell again. Look at the epoch "
                     "the second instance writes with, and at what it has open right now.")
    second, got = replay_takeover(bootstrap)
    return check(epoch == got,
                 f"the third instance writes with epoch {got}: one bump from B's {second}, "
                 "because nothing was open to abort (the double bump of step 2 came from "
                 "aborting the zombie's transaction).",
                 f"the new instance does not write with epoch {epoch}. How many times does "
                 "init_transactions() bump the epoch when the previous instance has nothing "
                 "open to abort?")


GROUP_RECORDS, GROUP_INSTANCES, GROUP_PARTITIONS = 180, 3, 6


@exercise("06_zombies", "2")
def check_group_duplicates(bootstrap: str, duplicates: int | None) -> Verdict:
    """06: predict the duplicates when one of three at_least_once instances is killed at
    after-process-before-commit on its second batch. The check runs it and audits."""
    from labkit import experiments

    if unanswered(duplicates):
        return check(False, "", "fill in my_duplicates, then run this cell again.")
    if isinstance(duplicates, bool) or not isinstance(duplicates, int):
        return check(False, "", "my_duplicates must be a whole number of payments.")
    run = experiments.run("consume-transform-produce", guarantee="at_least_once",
                          crash_at="after-process-before-commit",
                          records=GROUP_RECORDS, cluster=bootstrap,
                          instances=GROUP_INSTANCES,
                          partitions=GROUP_PARTITIONS)
    got = run.report.duplicated
    return check(duplicates == got,
                 f"the audit counts {got} duplicates: the batch instance 0 had written but "
                 "not committed; its partitions' next owner read it again from the committed "
                 "offsets. A group does not change what at_least_once means.",
                 f"the audit does not count {duplicates}. What had instance 0 written, and "
                 "not yet committed, when it died? Where does the member that takes over its "
                 "partitions start reading? (Batches hold 10 records.)")
