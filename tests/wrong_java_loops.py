"""Wrong Java loops, each a small edit of the lab's Java loop
(``examples/java_loop/ProductionLoop.java``), each a mistake tests/wrong_loops.py makes in
Python too; the judge must fail every one with its finding, on the phase named beside it.

    loop = wrong_java_loop("at-least-once")     # a JavaLoop the judge compiles and runs
    WRONG_JAVA[name].options, WRONG_JAVA[name].finding
"""
from __future__ import annotations

from dataclasses import dataclass, field

from labkit.exercises.java_loop import NO_TRANSACTION, CRASH_AT
from labkit.pipelines import java_loop
from labkit.pipelines.java_loop import JavaLoop

TRANSACTIONAL_ID = '        p.put("transactional.id", Lab.setting("transactional_id"));\n'


@dataclass(frozen=True)
class WrongJava:
    """A wrong Java loop: its edits, the judge's options that catch it, what it must find
    (an audit count: "lost", "duplicated", "aborted_visible"; or a finding's name)."""

    changes: dict[str, str]
    finding: str
    options: dict = field(default_factory=dict)
    why: str = ""


WRONG_JAVA: dict[str, WrongJava] = {
    "at-least-once": WrongJava(
        NO_TRANSACTION,
        "duplicated", {"phase": "point", "crash_at": CRASH_AT},
        "produce, flush, commitSync: no transaction, a crash between output and offsets "
        "writes the batch again"),
    "new-transactional-id": WrongJava(
        {TRANSACTIONAL_ID: '        p.put("transactional.id", Lab.setting("transactional_id") + "-"\n'
                           "              + java.util.UUID.randomUUID());  // a fresh one each start\n"},
        "hanging-transaction", {"phase": "point", "crash_at": "in-transaction-before-commit"},
        "a transactional.id that changes at every start: nothing fences what a dead instance "
        "left open"),
    "input-read-uncommitted": WrongJava(
        {'        c.put("isolation.level", "read_committed");  // the Java client\'s default reads aborted records\n': ""},
        "aborted-input-read", {"phase": "point", "crash_at": "after-commit"},
        "isolation.level left at the Java client's default, read_uncommitted: an upstream "
        "transaction's aborted records processed"),
}


def wrong_java_loop(name: str) -> JavaLoop:
    """The wrong loop ``name``: the reference with its edits, its class named after it."""
    return java_loop.reference().edited(
        "".join(part.title() for part in name.split("-")) + "Loop", WRONG_JAVA[name].changes)
