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


# What the zombie may be told: the exercise's choices, each with what it would mean.
TOLD = ("nothing", "INVALID_PRODUCER_EPOCH", "ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID")
_NOT_ASKED = object()  # a caller that judges the metadata alone (tests)


def _told_hint(told: str) -> str:
    """Where to look, for a wrong prediction: the cause, never the answer."""
    if told == "nothing":
        return ("your fenced_metadata did fence the zombie: its commit was refused, and each "
                "payment is once in the output. What did the group coordinator know about A "
                "by the time A woke up?")
    if told == "INVALID_PRODUCER_EPOCH":
        return ("that is section 3's fencing, between instances that share a transactional.id: "
                "A and B have transactional.ids of their own, and nothing bumped A's epoch. "
                "The group coordinator refused A's offsets: what did it know about A by the "
                "time A woke up?")
    return ("the coordinator answered something else. What does it do with a member that "
            "sends no heartbeat for longer than its session timeout (6 s), and when did that "
            "happen to A: before or after B was given the partition?")


def _told_reason(told: str) -> str:
    if told == "UNKNOWN_MEMBER_ID":
        return ("A sent no heartbeat while it was frozen, so once its session timed out the "
                "coordinator removed it from the group, before the rebalance that gave B the "
                "partition: the member its offsets named no longer existed")
    if told == "ILLEGAL_GENERATION":
        return ("A was still known to the group, but the generation its offsets named had "
                "ended with the rebalance that gave B the partition")
    return "they named a member and a generation that had ended"


@exercise("06_zombies", "2")
def check_fenced_zombie(metadata: Callable, shown: Callable, bootstrap: str | None = None,
                        told: object = _NOT_ASKED) -> Verdict:
    """06 · the learner's function gives the group metadata both instances' offsets carry into
    their transactions; the check runs the zombie after a rebalance (A frozen mid-transaction,
    B takes over, A wakes and commits) with it and audits the output. ``shown`` is the
    group-id-only function of section 5 (unchanged, it is not run again). ``told``: the
    learner's prediction of what the group coordinator answers the zombie (one of ``TOLD``),
    judged against the run."""
    from labkit import experiments

    asked = told is not _NOT_ASKED
    if asked and unanswered(told):
        return check(False, "", "predict what the zombie is told (my_zombie_told) and change "
                                "fenced_metadata, then run this cell again.")
    predicted = str(told).strip() if asked else ""
    predicted = "nothing" if predicted.lower() == "nothing" else predicted.upper()
    if asked and predicted not in TOLD:
        return check(False, "", f"my_zombie_told is {told!r}: write one of "
                                f"{', '.join(repr(t) for t in TOLD)}.")
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
    got = run.zombie_error.split(" (")[0].rsplit(": ", 1)[-1]
    if asked and predicted != got:
        return check(False, "", f"my_zombie_told is {predicted!r}, not what the zombie was told: "
                                f"{_told_hint(predicted)}")
    return check(True, f"the group coordinator refused the zombie's offsets ({got}): "
                       f"{_told_reason(got)}. The zombie aborted, and each payment is in the "
                       "output once.", "")
