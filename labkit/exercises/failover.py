"""03b · when the broker fails: the exercise check.

An unclean election lost acknowledged records even with acks=all. The learner keeps
unclean.leader.election.enable=true and acks=all and chooses the topic's
min.insync.replicas so that nothing acknowledged is lost; the check runs the real leader
failover on the notebook's failure lab with that setting and counts.
"""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered

RECORDS = 40


def judge(min_insync: int, lost_acknowledged: int, election: str) -> Verdict:
    why = (" The followers that left the ISR below min.insync.replicas stayed eligible to "
           "lead (KIP-966): they held every acknowledged record." if "KIP-966" in election else "")
    return check(lost_acknowledged == 0,
                 f"with min.insync.replicas={min_insync}, 0 acknowledged records lost; "
                 f"election: {election}.{why}",
                 f"with min.insync.replicas={min_insync}, {lost_acknowledged} acknowledged "
                 f"records are gone (election: {election}). When the frozen followers leave "
                 "the ISR, how many replicas must still be in it for acks=all to be "
                 "acknowledged, and what does Kafka 4 remember about a follower that leaves "
                 "the ISR below that number?")


@exercise("03b_when_the_broker_fails")
def check_no_acknowledged_loss(lab, min_insync: int | None) -> Verdict:
    """03b: acks=all with unclean election on; the learner's min.insync.replicas must lose
    nothing acknowledged. ``lab``: the notebook's failure lab (``labkit.kafka.failure_lab``)."""
    if unanswered(min_insync):
        return check(False, "", "fill in my_min_insync, then run this cell again.")
    if isinstance(min_insync, bool) or min_insync not in (1, 2, 3):
        return check(False, "", "my_min_insync must be 1, 2 or 3 (the topic has 3 replicas).")
    from labkit import experiments

    run = experiments.run("leader-failover", cluster=lab, acks="all",
                          min_insync=min_insync, unclean=True,
                          records=RECORDS)
    return judge(min_insync, run.lost_acknowledged, run.election)
