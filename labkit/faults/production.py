"""Production's faults, kind by kind, as one seeded schedule: what the judge puts a
consume-transform-produce loop under (``labkit.experiments.judge``) and what
``labkit torture --schedule production`` puts an app under. Both make their faults here.

    faults = production_faults("kills", seed=3, member=settings_of)   # one kind
    Schedule(production_faults("schedule", 3, member=settings_of), BETWEEN_S, seed=3, ...)

``member(run, i)`` is instance ``i``'s own settings (for a function its keyword arguments,
for a command its environment): a member that joins gets them, and a successor that fences
an instance gets them too, except its transactional id (``transactional``: the name of that
setting), which it takes over.

The kinds: SIGKILLs at random moments, one as an instance sends its output (what it
committed before then is all it has done) and one as it sends its commit (its
transaction's records all written: whatever the loop flushes, records of an aborted
transaction reach the log, so the reader's isolation is judged; a loop without a
transaction, as it commits its offsets, its output written); a produce ack lost and a
record refused on the wire (an abortable error); a member joining and one leaving (a
rebalance); an instance frozen until the group has moved its partitions on, then woken (a
zombie); the offsets sent to a transaction refused as a fenced member's are; a successor with
an instance's transactional id (a fatal error for the old one).
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable

from labkit.faults.nemesis import Fault, Run
from labkit.faults.process_faults import Freeze, Join, Kill, Leave, Replace, any_running
from labkit.faults.wire_faults import Arm

KINDS = {
    "wire": "a produce acknowledgement lost, then a record refused (an abortable error)",
    "kills": "SIGKILLs at random moments, one as an instance sent its output, one as it sent "
             "its commit",
    "rebalance": "a member joins the group, then one leaves",
    "zombie": "an instance frozen until the group moved its partitions on, then woken",
    "offsets": "the offsets sent to a transaction refused, as a fenced member's are",
    "fenced": "a successor starts with an instance's transactional.id",
}
SCHEDULE = "all of these, shuffled and spaced by a seed"
BETWEEN_S = (0.5, 1.0)  # between two faults of a schedule (after the loop's next commit)
# A zombie is woken once the group moved on, or after this long (Kafka's default session is
# 45 s: a loop with default settings is frozen that long before its partitions move).
FROZEN_AT_MOST_S = 60.0
OUTPUT_KILL = "kill:produce:1"  # its output on its way: lost with whatever it committed before
# its output all written and acknowledged, its commit not sent: the transaction's (EndTxn)
# or, for a loop without one, its offsets' (OffsetCommit): the window where a loop's
# guarantee is decided, crashed whatever crash points the loop has
COMMIT_KILL = "kill:endtxn:1+kill:offsetcommit:1"


class MovedOn:
    """``until(run, instance)`` for a Freeze: has the group moved on without the frozen
    instance? A member the group had when it froze is gone (asked at most once a second).
    Static and dynamic members alike: from outside, a dynamic member's id cannot be tied to
    the process that holds it, so the first member to leave counts."""

    def __init__(self) -> None:
        self.before: set[str] | None = None
        self.asked = 0.0

    def __call__(self, run: Run, instance: int) -> bool:
        now = time.monotonic()
        if now < self.asked + 1.0:
            return False
        self.asked = now
        members = run.progress.members()
        if members is None:
            return False
        ids = {member_id for member_id, _ in members}
        if self.before is None:  # just frozen: it is still one of them
            self.before = ids
            return False
        return bool(self.before - ids)


def production_faults(kind: str, seed: int, member: Callable[[Run, int], dict],
                      transactional: str = "transactional_id") -> list[Fault]:
    """The faults of ``kind`` (every kind for "schedule"), in the order a schedule then
    shuffles; seeded choices of the instance each one hits, among those running then."""
    if kind != "schedule" and kind not in KINDS:
        raise ValueError(f"unknown kind of fault {kind!r}: one of {', '.join(KINDS)}, schedule")
    rng = random.Random(seed)

    def pick() -> Callable[[Run], int]:
        return any_running(rng.randrange(1 << 30))

    kinds = {
        "wire": lambda: [Arm("drop-ack:produce:1", name="a produce acknowledgement lost"),
                         Arm("error:produce:1:INVALID_RECORD",
                             name="an abortable error on a Produce (a record refused)")],
        "kills": lambda: [Kill(pick()), Kill(pick()),
                          Arm(OUTPUT_KILL, name="an instance SIGKILLed as it sent its output"),
                          Arm(COMMIT_KILL, name="an instance SIGKILLed as it sent its commit")],
        "rebalance": lambda: [Join(settings=member), Leave(pick())],
        "zombie": lambda: [Freeze(pick(), for_s=FROZEN_AT_MOST_S, until=MovedOn())],
        "offsets": lambda: [Arm("error:txnoffsetcommit:1:ILLEGAL_GENERATION",
                                name="the offsets sent to the transaction refused")],
        "fenced": lambda: [Replace(pick(), settings=member, keep=(transactional,))]}
    chosen = KINDS if kind == "schedule" else [kind]
    return [fault for k in chosen for fault in kinds[k]()]


def describe(kind: str) -> str:
    return SCHEDULE if kind == "schedule" else KINDS[kind]
