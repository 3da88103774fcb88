"""01 · at-most-once: the exercise check.

The learner edits ``my_loop``, a copy of the notebook's ``commit_first``, so that no crash
loses a payment. The check runs the learner's function as the ``consumer`` scenario's worker
at every crash point its code passes (killed on its 2nd batch of 40 payments, restarted)
and audits the table each time: it passes when no run lost a payment. Hints name the crash
that lost payments and ask about that moment; they never name the line to move.
"""
from __future__ import annotations

from collections.abc import Callable

from labkit.exercises import not_changed, Verdict, check, exercise
from labkit.exercises.loops import crash_judged, killed
from labkit.pipelines.learner import fingerprint

SCENARIO = "consumer"
RECORDS = 40  # as in the notebook: 4 batches of 10, the crash on the 2nd batch
# commit_first's points that every edit keeps: polled, and half a batch in the table
REQUIRED_POINTS = ("after-poll-before-process", "mid-batch")


@exercise("01_at_most_once")
def check_loses_nothing(bootstrap: str, loop: Callable | None, shown: Callable) -> Verdict:
    """01: ``loop`` (the learner's edit of ``shown``, the notebook's commit_first) must lose
    no payment when the lab kills it at any crash point its code passes."""
    refused = not_changed(loop, "", fingerprint(shown), "my_loop is still commit_first, which section 2 showed losing a whole "
                       "batch. Change it, then run this cell again: the check then crashes your "
                       "loop.",
                          not_a_function="my_loop must be a function: def my_loop("
                       "bootstrap, input_topic, group_id, instance_id, db_path, sink_table): ...")
    if refused:
        return refused
    runs = crash_judged(loop, "my_loop", SCENARIO, bootstrap, REQUIRED_POINTS,
                        "At that moment, which offsets had the group committed, and which of "
                        "those payments were in the table?", RECORDS)
    if isinstance(runs, Verdict):
        return runs
    twice = killed(runs, "duplicated", "booked twice")
    return check(True, f"no crash lost a payment ({len(runs)} crashes: "
                       f"{', '.join(r.point for r in runs)})."
                       + (f" The price: {twice}. A loop that never skips a payment repeats some "
                          "after a crash: at-least-once, notebook 02." if twice else ""), "")
