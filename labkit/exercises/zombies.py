"""06 · zombies: the exercise check."""
from __future__ import annotations

from collections.abc import Callable

from labkit.exercises import Verdict, check, exercise, not_changed, unanswered, what_it_raised


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


ZOMBIE_RECORDS = 40


@exercise("06_zombies", "2")
def check_fenced_zombie(metadata: Callable, shown: Callable, bootstrap: str | None = None) -> Verdict:
    """06 · the learner's function gives the group metadata both instances' offsets carry into
    their transactions; the check runs the zombie after a rebalance (A frozen mid-transaction,
    B takes over, A wakes and commits) with it and audits the output. ``shown`` is the
    group-id-only function of section 5 (unchanged, it is not run again)."""
    from labkit import experiments

    refused = not_changed(metadata, "fenced_metadata", shown, (
        "fenced_metadata still builds the metadata of a consumer that never joined the group, "
        "as group_id_only does: its run above let the zombie commit. Change it, then run this "
        "cell again."))
    if refused:
        return refused
    try:
        run = experiments.run("zombie-rebalance", records=ZOMBIE_RECORDS, pipeline=metadata,
                              cluster=bootstrap, keep_topics=False)
    except Exception as exc:  # the learner's code, run in both instances: what it raised
        return check(False, "", f"the run failed: {what_it_raised(exc)}")
    report = run.report
    if report.duplicated or not run.zombie_error:
        return check(False, "", f"the zombie's commit went through: {report.duplicated} payments "
                                "are in the output twice. The coordinator refuses offsets only "
                                "when they name a member and a generation it can check: which "
                                "object knows the member that read this batch, and in which "
                                "generation?")
    if report.lost:
        return check(False, "", f"{report.lost} payments are missing from the output: the "
                                "metadata must let the live instance commit its own batches.")
    told = run.zombie_error.split(" (")[0].rsplit(": ", 1)[-1]
    return check(True, f"the group coordinator refused the zombie's offsets ({told}): they "
                       "named a member and a generation that had ended, the zombie aborted, "
                       "and each payment is in the output once.", "")
