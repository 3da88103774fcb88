"""03c · when the network takes sides: the exercise check.

With acks=1, broker 1, cut off from the controller and its followers, acknowledged every
record written during the split, and the heal truncated them all. The learner predicts how
many acknowledged records a run with a different record count loses; the check runs the real
isolated-leader experiment on the notebook's partitionable failure lab and counts.
"""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered

RECORDS = 10


def judge(predicted: int, lost_acknowledged: int) -> Verdict:
    return check(predicted == lost_acknowledged,
                 f"{RECORDS} records with acks=1: {lost_acknowledged} acknowledged records lost, "
                 "every one written while broker 1 was cut off.",
                 f"{predicted} is not what the run lost. Of the {RECORDS} records, how many "
                 "are written after broker 1 is isolated, who acknowledges each of them with "
                 "acks=1, and what does broker 1 do with its log when the network heals?")


@exercise("03c_when_the_network_takes_sides")
def check_split_loss(lab, predicted: int | None) -> Verdict:
    """03c: the learner's prediction of ``lost_acknowledged`` for acks=1 with 10 records.
    ``lab``: the notebook's failure lab, started with ``network=Network()``."""
    if unanswered(predicted):
        return check(False, "", "fill in my_lost, then run this cell again.")
    if isinstance(predicted, bool) or not isinstance(predicted, int) or not 0 <= predicted <= RECORDS:
        return check(False, "", f"my_lost must be a whole number from 0 to {RECORDS}.")
    from labkit import experiments

    run = experiments.run("isolated-leader", cluster=lab, acks="1", records=RECORDS)
    return judge(predicted, run.lost_acknowledged)
