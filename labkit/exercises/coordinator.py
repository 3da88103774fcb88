"""05b · when the coordinator fails: the exercise check.

The learner writes the rule that picks the next coordinator of a transactional.id from the
state of the ``__transaction_state`` partition that keeps it (its leader, replicas and ISR),
as a function of that state. The check tries the function on partitions of its own, whose
answer is not simply the replica after the leader, then reads the real partition of the
notebook's id, SIGKILLs its coordinator on the failure lab and asks the brokers where the id
went. A broker id instead of a function is judged by the same kill.
"""
from __future__ import annotations

from collections.abc import Callable

from labkit.exercises import Verdict, check, exercise, unanswered
from labkit.kafka.inspect.model import ReplicaState

BROKERS = (1, 2, 3)
# Partitions the controller could meet: (leader, replicas, ISR). Their next leaders differ
# from "the second replica", "the replica after the leader" and "the first in the ISR".
SAMPLES = ((1, (1, 2, 3), (1, 2, 3)),
           (1, (1, 2, 3), (1, 3)),
           (3, (2, 3, 1), (3, 1, 2)),
           (2, (3, 1, 2), (2, 1)))


def elected(state: ReplicaState) -> int:
    """The controller's choice when ``state.leader`` dies: the first replica, in replica
    order, that is still in the ISR."""
    return next(r for r in state.replicas if r != state.leader and r in state.isr)


def judge(guess: int, before: int, after: int) -> Verdict:
    return check(guess == after,
                 f"broker {before} died and broker {after} coordinates the id now: the "
                 "controller made the first in-sync replica of the partition, in replica "
                 "order, its leader, and the leader of that partition is the coordinator.",
                 f"broker {before} died and broker {guess} does not coordinate the id now. "
                 "Which replicas of the partition are left, and in which order does the "
                 "controller try them?")


def _state(leader: int, replicas: tuple[int, ...], isr: tuple[int, ...]) -> ReplicaState:
    return ReplicaState(partition=0, leader=leader, leader_epoch=0, replicas=replicas,
                        isr=isr, elr=())


def _answer(rule: Callable, state: ReplicaState) -> tuple[object, Verdict | None]:
    """What ``rule`` says for ``state``, or the "Not yet" its answer earns."""
    try:
        answer = rule(state)
    except Exception as exc:  # the learner's code: say what it raised
        return None, check(False, "", f"my_next_coordinator raised {type(exc).__name__}: {exc}")
    if unanswered(answer):
        return None, check(False, "", "my_next_coordinator returns None: make it return a broker "
                                      "id (1, 2 or 3), from state.leader, state.replicas and "
                                      "state.isr; then run this cell again.")
    if isinstance(answer, bool) or answer not in BROKERS:
        return None, check(False, "", f"my_next_coordinator returns {answer!r}: it must return "
                                      "a broker id, 1, 2 or 3.")
    return answer, None


def _check_rule(lab, transactional_id: str, rule: Callable) -> Verdict:
    for leader, replicas, isr in SAMPLES:
        answer, refused = _answer(rule, _state(leader, replicas, isr))
        if refused:
            return refused
        if answer != elected(_state(leader, replicas, isr)):
            return check(False, "", f"a partition led by broker {leader}, with replicas "
                                    f"{list(replicas)} and ISR {list(isr)}: my_next_coordinator "
                                    f"says broker {answer}, and the controller would not elect "
                                    f"it. Which replicas may it choose, and in which order does "
                                    "it try them?")
    from labkit.kafka.coordinators import kill_coordinator, transaction_state_partition

    lab.restart()  # a broker an earlier run left down
    _, state = transaction_state_partition(lab, transactional_id)
    answer, refused = _answer(rule, state)
    if refused:
        return refused
    before, after = kill_coordinator(lab, transactional_id)
    if before != state.leader:
        return check(False, "", f"the coordinator moved while the check ran (broker {before} "
                                f"was killed, the partition's leader a moment before was "
                                f"{state.leader}): run this cell again.")
    verdict = judge(answer, before, after)
    if not verdict.passed:
        return verdict
    return check(True, f"the partition of {transactional_id} had replicas "
                       f"{list(state.replicas)}, ISR {list(state.isr)}; {verdict.message}", "")


@exercise("05b_when_the_coordinator_fails")
def check_next_coordinator(lab, transactional_id: str, guess: Callable | int | None) -> Verdict:
    """05b: the coordinator of ``transactional_id`` after its broker is killed, as the
    learner's function of the partition's state (or a broker id)."""
    if unanswered(guess):
        return check(False, "", "fill in my_next_coordinator, then run this cell again.")
    if callable(guess):
        return _check_rule(lab, transactional_id, guess)
    if isinstance(guess, bool) or guess not in BROKERS:
        return check(False, "", "my_next_coordinator must be a broker id: 1, 2 or 3.")
    from labkit.kafka.coordinators import kill_coordinator

    before, after = kill_coordinator(lab, transactional_id)
    if guess == before:
        return check(False, "", f"broker {before} is the one that was killed: it cannot "
                                "coordinate anything while it is down.")
    return judge(guess, before, after)
