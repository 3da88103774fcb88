"""03 · idempotent producer: the exercise check."""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered

RECORDS = 40


@exercise("03_idempotent_producer")
def check_idempotent_crash(bootstrap: str, producer_ids: int | None,
                           duplicates: int | None) -> Verdict:
    """03: the idempotent at-least-once pipeline is killed at ``mid-batch`` (half of its 2nd
    batch written). Predict how many producer ids write to the output and how many
    duplicates the audit finds. The check runs it and reads both from the broker's log."""
    if unanswered(producer_ids) or unanswered(duplicates):
        return check(False, "", "fill in my_producer_ids and my_duplicates, then run this cell again.")
    from labkit import experiments
    from labkit.kafka.inspect import describe_topic

    run = experiments.run("consume-transform-produce", guarantee="at_least_once",
                          crash_at="mid-batch", records=RECORDS,
                          cluster=bootstrap, options={"idempotent": True})
    view = describe_topic(bootstrap, run.topics["output"])
    got_ids = len({b.producer_id for b in view.batches if not b.is_control})
    got_dups = run.report.duplicated
    if (producer_ids, duplicates) == (got_ids, got_dups):
        return check(True, f"{got_ids} producer ids and {got_dups} duplicates. The restarted "
                           "process is a new producer with sequences from 0, so the broker has "
                           "nothing to compare its repeated half batch with.", "")
    hints = []
    if producer_ids != got_ids:
        hints.append(f"the log does not show {producer_ids} producer id(s): does a restarted "
                     "process keep its producer id?")
    if duplicates != got_dups:
        hints.append(f"the audit did not count {duplicates} duplicates: what had been written "
                     "of the batch the restarted process repeats?")
    return check(False, "", " ".join(hints))
