"""08f · Flink's two-phase-commit Kafka sink: the exercise check.

The learner's job sets its sink's delivery guarantee and ``transaction.timeout.ms`` itself.
The operators promise to restore a crashed job within RESTORE_MS. The check crashes the job
as the timeout trap did (SIGKILLed once a checkpoint completed, before its commit; down
DOWN_S, then its restart), and passes when the restore lost nothing and wrote nothing
twice, the sink wrote in transactions, and the broker gives those transactions at least
RESTORE_MS (read from the broker while the job stood frozen, not from the code). A timeout above the broker's
transaction.max.timeout.ms is refused as the job starts: the check says so in Flink's words.
"""
from __future__ import annotations

from collections.abc import Callable

from labkit import experiments
from labkit.exercises import Verdict, check, exercise, not_changed
from labkit.flink.outcome import FlinkJobError

RESTORE_MS = 300_000  # "a crashed job is running again within 5 minutes"
DOWN_S = 3.0  # the crash's downtime: with the restart, longer than the trap's 5 s timeout


@exercise("08f_flink_two_phase_commit", "1")
def check_flink_job(job: Callable, bootstrap: str) -> Verdict:
    """08f · the learner's job, crashed before its commit and kept down; passes when the
    restore keeps every payment once and the broker's timeout covers a 5-minute restore.
    Every answer, the shipped one too, is judged by the crash (about half a minute)."""
    not_a_function = not_changed(job, "my_job")
    if not_a_function is not None:
        return not_a_function
    try:
        run = experiments.run("flink-timeout-trap", cluster=bootstrap, pipeline=job,
                              down_s=DOWN_S, keep_topics=False)
    except FlinkJobError as exc:  # e.g. refused as it started: Flink's words end the message
        said = str(exc).split("Flink said: ")[-1].splitlines()[0][:400]
        return check(False, "", f"the job did not run: {said}")
    except ValueError as exc:  # the job's code, refused before anything started
        return check(False, "", str(exc).splitlines()[0][:400])
    r, (kill,) = run.report, run.kills
    if kill.transaction is None:
        return check(False, "", f"nothing was lost ({r.duplicated} written twice), but the "
                                "sink wrote without transactions: the broker knows none of "
                                "its transactional ids. Killed between two checkpoints, as in "
                                "section 2, it writes again what it wrote since the last one.")
    if r.lost:
        return check(False, "", f"{r.lost} payments lost: the broker aborted the transaction "
                                f"of checkpoint {kill.checkpoint} after {kill.timeout_ms} ms, "
                                f"while the job was down {DOWN_S:g} s and restarting.")
    if kill.timeout_ms < RESTORE_MS:
        return check(False, "", f"nothing lost after {DOWN_S:g} s down, but the broker gives "
                                f"the sink's transactions {kill.timeout_ms} ms: a restore 5 "
                                "minutes after a crash would lose a checkpoint's payments.")
    return check(not r.duplicated and r.exactly_once,
                 f"the job was SIGKILLed after checkpoint {kill.checkpoint} completed and kept "
                 f"down {DOWN_S:g} s; the restored job committed its transaction: "
                 f"{r.produced} payments, each once. The broker gives each transaction "
                 f"{kill.timeout_ms} ms: longer than a 5-minute restore, within its "
                 "transaction.max.timeout.ms.",
                 f"{r.duplicated} payments written twice: {r.summary().splitlines()[-1]}")
