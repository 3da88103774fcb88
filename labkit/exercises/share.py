"""11 · share groups: the exercise check.

A poison record (its processing always fails) in a share group of one consumer, 40 records.
The learner predicts how many times the broker delivers it when the consumer RELEASEs it
each time, and picks the acknowledgement that has it archived at its first delivery. The
check runs the real share group with each and reads the delivery counts back from what the
consumer wrote per attempt.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from labkit.exercises import Verdict, check, exercise, unanswered

GUARANTEE, RECORDS = "at_least_once", 40
CHOICES = ("release", "reject")


def _poison_deliveries(bootstrap: str, poison: str) -> tuple[list[int], int]:
    """The poison record's delivery counts, attempt by attempt, and how many were archived."""
    from labkit import experiments

    run = experiments.run("share-group", guarantee=GUARANTEE, records=RECORDS,
                          cluster=bootstrap, poison=poison)
    return [a.delivery_count for a in run.attempts if a.outcome != "processed"], run.archived


@exercise("11_share_groups")
def check_poison(bootstrap: str, deliveries_with_release: int | None,
                 ack_for_one_delivery: str | None) -> Verdict:
    """``deliveries_with_release``: how many times the released poison record is delivered;
    ``ack_for_one_delivery``: "release" or "reject", the acknowledgement after which the
    broker archives it at its first delivery."""
    if unanswered(deliveries_with_release) or unanswered(ack_for_one_delivery):
        return check(False, "", "set my_deliveries (a whole number) and my_ack "
                                f"({' or '.join(repr(c) for c in CHOICES)}), then run this cell again.")
    if not isinstance(deliveries_with_release, int) or isinstance(deliveries_with_release, bool) \
            or deliveries_with_release < 1:
        return check(False, "", "my_deliveries must be a whole number of deliveries, 1 or more.")
    if ack_for_one_delivery not in CHOICES:
        return check(False, "", f"my_ack must be one of {', '.join(repr(c) for c in CHOICES)}.")
    wanted = ["release"] if ack_for_one_delivery == "release" else ["release", ack_for_one_delivery]
    with ThreadPoolExecutor(len(wanted)) as pool:  # both runs mostly wait on the broker
        seen = dict(zip(wanted, pool.map(lambda p: _poison_deliveries(bootstrap, p), wanted)))
    released, _ = seen["release"]
    mine, archived = seen[ack_for_one_delivery]
    if deliveries_with_release != len(released):
        return check(False, "", f"you said {deliveries_with_release}; the broker delivered the "
                                f"released poison record a different number of times. Look at "
                                "the broker's settings printed in section 1 (which one limits "
                                "deliveries?) and at section 4's attempts.")
    return check(len(mine) == 1 and archived == 1,
                 f"released, the poison record was delivered {len(released)} times "
                 f"(delivery counts {released}) before the broker archived it; with "
                 f"{ack_for_one_delivery.upper()} it was archived at its first delivery.",
                 f"{len(released)} deliveries is right. But with {ack_for_one_delivery.upper()} "
                 f"the record was delivered {len(mine)} times: that acknowledgement hands it "
                 "back for another try. Which one tells the broker never to deliver it again?")
