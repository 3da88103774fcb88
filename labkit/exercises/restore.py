"""07b · what a crash costs Kafka Streams: the exercise check.

The learner predicts how much of its state the real Kafka Streams app restores from the
changelog after a SIGKILL with transactional state stores on (KIP-892) and the lab's eight
short keys: all of the committed changelog records, part of them or none. The check runs
the ``streams-restore`` experiment and compares the prediction with what the restarted
instance restored.
"""
from __future__ import annotations

from labkit import experiments
from labkit.exercises import Verdict, check, exercise, unanswered

ANSWERS = ("all", "part", "none")
RECORDS = 1000  # ~15 s on a 2-core machine: the kill lands half way (docs/measurements.md)


def restored_share(committed: int, restored: int) -> str:
    """How much of what was committed at the kill the restarted instance read back."""
    if restored >= committed:
        return "all"
    return "part" if restored > 0 else "none"


def judge(answer: str, measured: str, committed: int, restored: int) -> Verdict:
    """The verdict for ``answer`` against the run's ``measured`` share. A wrong answer gets
    a question to ask, never the measured share or its numbers."""
    why = {"all": " The eight short counts never left RocksDB's memtable, and Kafka Streams "
                  "runs RocksDB without its write-ahead log: the kill took the whole store, so "
                  "the restart rebuilt it from the changelog, transactional stores or not. The "
                  "setting keeps only what a flush has written to disk."}.get(measured, "")
    return check(answer == measured,
                 f"killed with {committed} input records committed, the restarted instance "
                 f"restored {restored} changelog records: {measured}.{why}",
                 "that is not what the restarted instance did. Ask where the eight short "
                 "counts were when the JVM was killed: had RocksDB flushed its memtable "
                 "(16 MiB) to disk yet, and what is left of a memtable after a SIGKILL when "
                 "Kafka Streams runs RocksDB without its write-ahead log?")


@exercise("07b_what_a_crash_costs_kafka_streams")
def check_short_keys(bootstrap: str, answer: str | None) -> Verdict:
    """07b: predict the restore with transactional stores on and the lab's short keys."""
    if unanswered(answer):
        return check(False, "", "fill in my_restore, then run this cell again.")
    if not isinstance(answer, str) or answer.strip().lower() not in ANSWERS:
        return check(False, "", 'my_restore must be "all", "part" or "none" (with the quotes).')
    run = experiments.run("streams-restore", cluster=bootstrap, transactional_stores=True,
                          records=RECORDS, key_bytes=0)
    measured = restored_share(run.committed_at_kill, run.restored_records)
    return judge(answer.strip().lower(), measured, run.committed_at_kill, run.restored_records)
