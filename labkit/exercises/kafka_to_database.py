"""05c · Kafka into a database: the exercise check.

The learner's consumer writes each payment with ``INSERT ... ON CONFLICT (id) DO NOTHING``
and keeps a count of payments per account, its offsets committed to Kafka after the rows: a
batch read again after a crash must leave each row once and each count right. The check
runs it as the lab ran section 5's idempotent write: two instances over three partitions,
instance 0 SIGKILLed after its first batch's rows and instance 1 in the middle of its first
batch, a third member joining once half the input is written (a rebalance); then it audits
the payments table and the ``accounts`` counts.
"""
from __future__ import annotations

from collections.abc import Callable

from labkit.exercises import (Verdict, check, exercise, keeps_crash_points, not_changed,
                              what_it_raised)

POINTS = ("after-process-before-commit", "mid-batch")  # instance 0's, instance 1's


@exercise("05c_kafka_into_a_database")
def check_counted_once(function: Callable, shown: Callable,
                       bootstrap: str | None = None) -> Verdict:
    """``function``, the learner's consumer, crashed at ``POINTS`` with a member joining:
    each payment stored once and counted once? ``shown`` is section 5's idempotent write
    (unchanged, it is not run again: its over-count was measured there)."""
    refused = not_changed(function, "counted_once", shown, (
        "counted_once is still the idempotent write of section 5, whose count per account "
        "counted a replayed batch again. Change it, then run this cell again: the check then "
        "crashes your consumer and adds a member to its group."))
    refused = refused or keeps_crash_points(function, POINTS)
    if refused:
        return refused
    from labkit import experiments

    try:
        run = experiments.run("kafka-to-database", approach="idempotent", totals=True,
                              crash_at=",".join(POINTS), pipeline=function, cluster=bootstrap)
    except Exception as exc:  # the learner's code, run as the worker: what it raised
        return check(False, "", f"the run failed: {what_it_raised(exc)}")
    return judged(run)


def judged(run) -> Verdict:
    """The verdict on one run: the rows, then the counts, each with a hint that points at
    the cause, never at the code."""
    report = run.report
    if run.errors:
        return check(False, "", f"your consumer raised {run.errors[0]['raised']} (instance "
                                f"{run.errors[0]['instance']}); it was started again, but a "
                                "consumer that fails on its input fails again on it.")
    if sorted(run.crashed) != sorted(POINTS):
        return check(False, "", f"the lab could not kill your consumer at {', '.join(POINTS)} "
                                f"(it was killed at: {', '.join(run.crashed) or 'none'}): "
                                "does each instance reach those lines on its first batch?")
    if report.lost:
        return check(False, "", f"{report.lost} payment(s) are missing from the table. "
                                "Nothing may be marked done before its row is written.")
    if report.duplicated:
        return check(False, "", f"{report.duplicated} payment(s) are in the table twice: a "
                                "replayed batch must not add a row whose id is there already.")
    expected, counted = report.state_expected, report.state_actual
    off = {k: counted.get(k, 0) - n for k, n in expected.items() if counted.get(k, 0) != n}
    over, under = sum(d for d in off.values() if d > 0), -sum(d for d in off.values() if d < 0)
    if over:
        return check(False, "", f"each payment is stored once, but the counts per account "
                                f"are {over} too high ({len(off)} account(s)): a replayed "
                                "batch was counted again. Your code can learn from the "
                                "database whether the payment it is storing was there already.")
    if under:
        return check(False, "", f"the counts per account are {under} too low: payments were "
                                "stored but never counted. A crash can come between any two "
                                "of your statements: which of them must take effect together?")
    return check(True, f"killed after its first batch's rows and in the middle of a batch, "
                       f"a third member joining, your consumer stored each of the "
                       f"{report.produced} payments once and counted each once: every count "
                       "per account matches.", "")
