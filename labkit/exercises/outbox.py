"""05d · the outbox: the exercise check.

The learner's service stores payments and their events, the events as rows of the outbox
table in the same database (no Kafka: Debezium reads that table). The check runs it as the
lab ran the dual write (``dual-write`` with ``order="outbox"``): 40 payments in batches of
10, SIGKILLed on the second batch between the payments and their outbox rows, started again;
then it audits the outbox table: every payment's event there once.
"""
from __future__ import annotations

from collections.abc import Callable

from labkit.exercises import (Verdict, check, exercise, keeps_crash_points, not_changed,
                              what_it_raised)

POINT = "after-payment-before-event"


@exercise("05d_the_outbox")
def check_outbox_service(function: Callable, bootstrap: str | None = None) -> Verdict:
    """``function(dsn, payments)``, killed between its payments and their outbox rows: is
    every payment's event in the outbox, once?"""
    refused = not_changed(function, "outbox_service") or keeps_crash_points(function, (POINT,))
    if refused:
        return refused
    from labkit import experiments

    try:
        run = experiments.run("dual-write", order="outbox", pipeline=function,
                              cluster=bootstrap)
    except Exception as exc:  # the learner's code, run as the worker: what it raised
        return check(False, "", f"the run failed: {what_it_raised(exc)}")
    report = run.report
    if run.crashed != [POINT]:
        return check(False, "", f"the lab could not kill your service at {POINT} (killed at: "
                                f"{', '.join(run.crashed) or 'none'}): does it pass that line "
                                "on its second batch of 10?")
    if run.table_unique != report.produced:
        return check(False, "", f"the payments table holds {run.table_unique} of the "
                                f"{report.produced} payments: every payment must be stored.")
    if report.lost:
        return check(False, "", f"{report.lost} payments are stored without their event: "
                                "the kill came after their rows and before their outbox rows, "
                                "and the restarted service, finding the payments stored, "
                                "never wrote those events. What would make the two writes "
                                "take effect together?")
    if report.duplicated:
        return check(False, "", f"{report.duplicated} events are in the outbox twice.")
    return check(True, f"killed between a batch's payments and their outbox rows, your service "
                       f"lost no event: {report.produced} payments, {report.delivered_unique} "
                       "outbox rows, each once. What the transaction committed, Debezium "
                       "streams; what it rolled back never existed.", "")
