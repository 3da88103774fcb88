"""03 · idempotent producer: the exercise checks.

1. The learner's copy of ``send_payments`` must keep one account's payments in order under
   the reorder experiment's failing request *without* idempotence. The check runs it through
   the ``reorder`` experiment (``idempotent=False``) and reads the order from the broker's
   log, and the producer ids the log holds (-1 only: no idempotence).
2. A prediction: section 4's idempotent at-least-once loop (the learner's cell, as shown)
   killed at its ``mid-batch`` crash point. The check runs that loop and reads the answer
   from the broker's log and the audit.
"""
from __future__ import annotations

from collections.abc import Callable

from labkit.exercises import (Verdict, check, exercise, keeps_crash_points, not_changed,
                              unanswered)
from labkit.exercises.loops import LoopFailed, last_line
from labkit.pipelines.learner import fingerprint

RECORDS = 40
ORDER_RECORDS = 20  # one account's payments, as in the notebook's reorder runs


def run_without_idempotence(bootstrap: str, send: Callable):
    """The ``reorder`` experiment with ``send`` as its producer and ``idempotent=False``;
    returns the run and the producer ids in its log (-1: a producer without idempotence)."""
    from labkit import experiments
    from labkit.kafka.inspect import describe_topic

    producer_ids: set[int] = set()

    def observed(proxy_bootstrap: str, topic: str, payments: list[dict], idempotent: bool) -> None:
        send(proxy_bootstrap, topic, payments, idempotent)
        producer_ids.update(b.producer_id for b in describe_topic(bootstrap, topic).batches
                            if not b.is_control)

    try:
        run = experiments.run("reorder", cluster=bootstrap, idempotent=False,
                              records=ORDER_RECORDS, pipeline=observed)
    except Exception as exc:  # the learner's producer, run here: say what it did, briefly
        raise LoopFailed(last_line(f"{type(exc).__name__}: {exc}")) from None
    return run, producer_ids


@exercise("03_idempotent_producer", "1")
def check_keeps_order(bootstrap: str, send: Callable | None, shown: Callable) -> Verdict:
    """03 · 1: ``send`` (the learner's copy of ``shown``, send_payments) must keep the
    account's payments in order under the failing request, with idempotence off."""
    refused = not_changed(send, "", fingerprint(shown), "my_send_payments is still send_payments, which reordered the account's "
                       "payments with idempotence off. Change it, then run this cell again: the "
                       "check then runs your producer.",
                          not_a_function="my_send_payments must be a function, like send_payments.")
    if refused:
        return refused
    try:
        run, producer_ids = run_without_idempotence(bootstrap, send)
    except LoopFailed as failed:
        return check(False, "", f"my_send_payments failed: {failed}")
    r = run.report
    if producer_ids - {-1}:
        return check(False, "", "the log shows a producer id: that is idempotence, which keeps "
                                "the order as section 3 showed. Keep it off here (the check "
                                "passes idempotent=False) and find another way.")
    if r.lost or r.duplicated:
        return check(False, "", f"the audit counted {r.lost} lost and {r.duplicated} duplicated: "
                                "every payment must arrive, once.")
    return check(r.reordered == 0,
                 f"the {r.produced} payments are in order with idempotence off, through the same "
                 f"failing request: {run.produce_requests} Produce requests. Order without "
                 "idempotence costs throughput; idempotence keeps it with 5 requests in flight.",
                 f"still out of order (reordered={r.reordered}): the retried batch landed behind a "
                 "later one. When the retry went out, which later payments had your code already "
                 "handed to the producer?")


@exercise("03_idempotent_producer", "2")
def check_idempotent_crash(bootstrap: str, producer_ids: int | None, duplicates: int | None,
                           loop: Callable) -> Verdict:
    """03: ``loop`` (section 4's idempotent_process_then_commit, the cell on screen) is killed
    at its ``mid-batch`` crash point (half of its 2nd batch written). Predict how many
    producer ids write to the output and how many duplicates the audit finds. The check
    runs that loop and reads both from the broker's log."""
    if unanswered(producer_ids) or unanswered(duplicates):
        return check(False, "", "fill in my_producer_ids and my_duplicates, then run this cell again.")
    refused = (not_changed(loop, "idempotent_process_then_commit") or
               keeps_crash_points(loop, ("mid-batch",)))
    if refused:
        return refused
    from labkit import experiments
    from labkit.faults.runner import WorkerFailed
    from labkit.kafka.inspect import describe_topic
    from labkit.pipelines.learner import LearnerCodeError

    try:
        run = experiments.run("consume-transform-produce", guarantee="at_least_once",
                              crash_at="mid-batch", records=RECORDS, cluster=bootstrap,
                              pipeline=loop)
    except (WorkerFailed, LearnerCodeError) as exc:  # the learner's cell, run here: say what it did
        return check(False, "", f"{loop.__name__} stopped with an error in the lab's worker: "
                                f"{last_line(str(exc))}")
    view = describe_topic(bootstrap, run.topics["output"])
    found = {b.producer_id for b in view.batches if not b.is_control}
    if -1 in found:  # a producer without idempotence: not the loop the question is about
        return check(False, "", f"the log shows records without a producer id: {loop.__name__} "
                                "ran without idempotence. Run section 4's cell as shipped "
                                "(enable.idempotence True), then this cell again.")
    got_ids, got_dups = len(found), run.report.duplicated
    if (producer_ids, duplicates) == (got_ids, got_dups):
        return check(True, f"{got_ids} producer ids and {got_dups} duplicates. The restarted "
                           "process is a new producer with sequences from 0, so the broker has "
                           "nothing to compare its repeated half batch with.", "")
    hints = []
    if producer_ids != got_ids:
        hints.append(f"the log does not show {producer_ids} producer id(s): does a restarted "
                     "process keep its producer id?")
    if duplicates != got_dups:
        hints.append(f"the audit did not count {duplicates} duplicates: what had been written "
                     "of the batch the restarted process repeats?")
    return check(False, "", " ".join(hints))
