"""02 · at-least-once: the exercise check.

The learner's loop writes payments into a ledger table and commits its offsets after the
rows, so a crash in between replays a batch. The learner changes it so that the table holds
each payment once after any crash. The check runs the learner's function as the
``consumer`` scenario's worker at every crash point its code passes (killed on its 2nd batch
of 40 payments, restarted) and audits the table each time: it passes when no run lost or
doubled a payment. Hints ask about the moment that went wrong, never name the fix.
"""
from __future__ import annotations

from collections.abc import Callable

from labkit.exercises import not_changed, Verdict, check, exercise
from labkit.exercises.loops import crash_judged, killed

SCENARIO = "consumer"
RECORDS = 40  # 4 batches of 10, the crash on the 2nd batch
# The loop as the exercise gives it (the fingerprint of my_ledger_loop's shipped code:
# tests/test_exercises_01_03.py checks the notebook against it): unchanged, nothing runs.
GIVEN = "66ffabc4d77dda58"
REQUIRED_POINTS = ("mid-batch", "after-process-before-commit")


@exercise("02_at_least_once")
def check_books_once(bootstrap: str, loop: Callable | None) -> Verdict:
    """02: ``loop``, the learner's ledger loop, must leave each payment once in the table
    whatever crash point it is killed at."""
    refused = not_changed(loop, "", GIVEN, "my_ledger_loop is still the loop as given: a crash between its inserts "
                       "and its commit replays the batch into the table. Change it, then run "
                       "this cell again: the check then crashes your loop.",
                          not_a_function="my_ledger_loop must be a function: def my_ledger_loop("
                       "bootstrap, input_topic, group_id, instance_id, db_path, sink_table): ...")
    if refused:
        return refused
    runs = crash_judged(loop, "my_ledger_loop", SCENARIO, bootstrap, REQUIRED_POINTS,
                        "Was a batch counted as done before all its rows were in the table?",
                        RECORDS)
    if isinstance(runs, Verdict):
        return runs
    if killed(runs, "duplicated", "booked twice"):
        return check(False, "", f"{killed(runs, 'duplicated', 'booked twice')}. The restarted loop "
                                "inserts rows of a batch that had reached the table already: what "
                                "could make inserting the same payment a second time change "
                                "nothing?")
    return check(True, f"{len(runs)} crashes ({', '.join(r.point for r in runs)}), and every "
                       f"time the table held each of the {RECORDS} payments once. The loop "
                       "still processes a replayed batch again; the table makes the repeat "
                       "harmless.", "")
