"""01 · at-most-once: the exercise check."""
from __future__ import annotations

from collections.abc import Callable

from labkit.exercises import Verdict, check, exercise, unanswered

RECORDS = 40  # as in the notebook: 4 batches of 10, the crash on the 2nd batch


@exercise("01_at_most_once")
def check_mid_batch_loss(bootstrap: str, predicted_lost: int | None,
                         pipeline: Callable | None = None) -> Verdict:
    """01: predict how many of 40 payments the at-most-once consumer loses when it is killed
    at ``mid-batch`` (half of its 2nd batch written to the table).

    The check really runs that crash, on ``pipeline`` (the notebook's ``commit_first``; by
    default the lab's reference consumer), and compares with what the audit counts in the
    table.
    """
    if unanswered(predicted_lost):
        return check(False, "", "fill in my_lost, then run this cell again.")
    from labkit import experiments

    report = experiments.run("consumer", guarantee="at_most_once",
                             crash_at="mid-batch", records=RECORDS, pipeline=pipeline,
                             cluster=bootstrap).report
    return check(predicted_lost == report.lost,
                 f"the audit counted {report.lost} lost. The offsets of the whole batch were "
                 "committed first, only half of it reached the table, and the restarted consumer "
                 "resumed after the batch.",
                 f"the audit did not count {predicted_lost} lost: "
                 f"{'fewer' if report.lost < predicted_lost else 'more'}. Which offsets were "
                 "committed before the crash, and how much of that batch was already written?")
