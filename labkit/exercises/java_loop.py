"""09d · the Java loop: the exercise check.

The notebook shows the lab's loop in Java judged exact, then the same file with its
transaction taken out: produce, flush, then ``consumer.commitSync`` of the positions (the
usual at-least-once loop). The judge crashes an instance after its flush and before that
commit. The learner predicts the audit's verdict and how many records it calls lost; the
check runs the judge on that loop and compares with what Kafka's output shows.
"""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered
from labkit.pipelines import java_loop
from labkit.pipelines.java_loop import JavaLoop

VERDICTS = ("exactly once", "at least once", "at most once")
CRASH_AT = "in-transaction-before-commit"  # after the flush, before the offsets' commit
# The edits that take the transaction out of ProductionLoop.java (tests/wrong_java_loops.py
# judges this loop too).
NO_TRANSACTION = {
    '        p.put("transactional.id", Lab.setting("transactional_id"));\n':
        "        // no transactional.id: no transaction\n",
    "            producer.initTransactions();  // fences an older instance and aborts what it left open\n": "",
    "                producer.beginTransaction();\n": "",
    "                ConsumerGroupMetadata member = consumer.groupMetadata();\n": "",
    "                    producer.sendOffsetsToTransaction(next, member);  // as the batch was read\n":
        "                    consumer.commitSync(next);  // after the output\n",
    "                    commit(producer);  // again while it times out\n": "",
    "                    producer.abortTransaction();  // drop the output and the offsets...\n": "",
}


def no_transaction_loop() -> JavaLoop:
    """ProductionLoop.java without its transaction, as the class ``NoTransactionLoop``."""
    return java_loop.reference().edited("NoTransactionLoop", NO_TRANSACTION)


def measured(cluster: object = None) -> dict:
    """The judge's run of the loop without a transaction, an instance crashed at CRASH_AT:
    the audit's verdict and counts, and whether the crash fired."""
    from labkit import experiments

    run = experiments.run("judge", pipeline=no_transaction_loop(), phase="point",
                          crash_at=CRASH_AT, cluster=cluster, announce=lambda line: None)
    return {"verdict": run.verdict, "lost": run.report.lost,
            "duplicated": run.report.duplicated, "crashed": CRASH_AT in run.crashed}


def judge(verdict: str, lost: int, run: dict) -> Verdict:
    if (verdict, lost) == (run["verdict"], run["lost"]):
        return check(True, f"the audit: {run['lost']} lost, {run['duplicated']} duplicated, "
                           f"{run['verdict']}. The batch was written and flushed, its offsets "
                           "not yet committed: the restarted instance read it again from the "
                           "last commit and wrote it a second time. A transaction would have "
                           "kept both or neither.", "")
    if verdict != run["verdict"]:
        return check(False, "", "not the audit's verdict. When the instance died, what was "
                                "already in the output topic, and where does its restart "
                                "begin reading?")
    return check(False, "", "the verdict matches; the lost count does not. Is a record whose "
                            "offset was never committed ever skipped by the restart?")


@exercise("09d_the_java_loop")
def check_without_transaction(verdict: str | None, lost: int | None,
                             cluster: object = None) -> Verdict:
    """09d: predict the verdict and the lost count of the Java loop without a transaction,
    crashed between its flush and its commit; the check runs the judge."""
    if unanswered(verdict) or unanswered(lost):
        return check(False, "", "fill in my_verdict and my_lost, then run this cell again.")
    if verdict not in VERDICTS:
        return check(False, "", f"my_verdict must be one of: {', '.join(map(repr, VERDICTS))}.")
    if not isinstance(lost, int) or isinstance(lost, bool) or lost < 0:
        return check(False, "", "my_lost must be a whole number, 0 or more.")
    return judge(verdict, lost, measured(cluster))
