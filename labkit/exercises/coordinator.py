"""05b · when the coordinator fails: the exercise check.

The learner reads the replicas of the ``__transaction_state`` partition that keeps a
transactional.id and predicts which broker coordinates the id once its coordinator dies.
The check SIGKILLs the coordinator on the notebook's failure lab and asks the brokers.
"""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered

BROKERS = (1, 2, 3)


def judge(guess: int, before: int, after: int) -> Verdict:
    return check(guess == after,
                 f"broker {before} died and broker {after} coordinates the id now: the "
                 "controller made the first in-sync replica of the partition, in replica "
                 "order, its leader, and the leader of that partition is the coordinator.",
                 f"broker {before} died and broker {guess} does not coordinate the id now. "
                 "Which replicas of the partition are left, and in which order does the "
                 "controller try them?")


@exercise("05b_when_the_coordinator_fails")
def check_next_coordinator(lab, transactional_id: str, guess: int | None) -> Verdict:
    """05b: predict the coordinator of ``transactional_id`` after its broker is killed."""
    if unanswered(guess):
        return check(False, "", "fill in my_next_coordinator, then run this cell again.")
    if isinstance(guess, bool) or guess not in BROKERS:
        return check(False, "", "my_next_coordinator must be a broker id: 1, 2 or 3.")
    from labkit.kafka.coordinators import kill_coordinator

    before, after = kill_coordinator(lab, transactional_id)
    if guess == before:
        return check(False, "", f"broker {before} is the one that was killed: it cannot "
                                "coordinate anything while it is down.")
    return judge(guess, before, after)
