"""11 · share groups: the exercise check.

A poison record (its processing always fails) in a share group of one consumer, 40 records,
released each time. The learner predicts how many times the broker delivers it when the
group sets its own delivery limit (a group config, not the broker's 5 the lesson ran with).
The check runs the real share group with that limit and reads the delivery counts back from
what the consumer wrote per attempt.
"""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered

GUARANTEE, RECORDS = "at_least_once", 40
# The group's own limit in the exercise: not the broker's 5 that section 4 showed.
EXERCISE_LIMIT = 3


def _poison_run(bootstrap: str):
    from labkit import experiments

    return experiments.run("share-group", guarantee=GUARANTEE, records=RECORDS,
                           cluster=bootstrap, poison="release", delivery_limit=EXERCISE_LIMIT)


@exercise("11_share_groups")
def check_poison(bootstrap: str, deliveries: int | None) -> Verdict:
    """``deliveries``: how many times the released poison record is delivered in a group whose
    delivery limit is EXERCISE_LIMIT."""
    if unanswered(deliveries):
        return check(False, "", "set my_deliveries (a whole number), then run this cell again.")
    if not isinstance(deliveries, int) or isinstance(deliveries, bool) or deliveries < 1:
        return check(False, "", f"my_deliveries must be a whole number, 1 or more, not "
                                f"{deliveries!r}.")
    run = _poison_run(bootstrap)
    released = [a.delivery_count for a in run.attempts if a.outcome != "processed"]
    return check(deliveries == len(released),
                 f"the poison record was delivered {len(released)} times (delivery counts "
                 f"{released}), then archived; the other {RECORDS - 1} were processed once.",
                 f"you said {deliveries}; the broker delivered the released poison record a "
                 "different number of times. Which setting ends the redeliveries, which value "
                 "does it have for this group, and does the first delivery count?")
