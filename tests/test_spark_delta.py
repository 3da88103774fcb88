"""Delta Lake's idempotent writes (txnAppId + txnVersion) against a plain Delta append.

The crash experiments themselves (30 records, SIGKILL between the Delta commit and Spark's
commits/1, restart from the checkpoint) run once, in notebook 08c, whose compared output
is the check: both audits, the txnVersion run's timeline (the replay of batch 1 skipped)
and both tables' DESCRIBE HISTORY (3 commits carrying txnVersion 0-2 against 4 plain ones).
They ran here too, a second time, until the suite had to fit its 30 minutes. A learner's
Delta sink without the two options is judged in test_spark_learner_code, Delta under a
replay that computes something else in notebook 08d.
"""
from __future__ import annotations


def test_exercise_hints_without_running():
    """A missing or malformed answer gets a hint at once (no Spark run, no answer given)."""
    from labkit.exercises.spark_replay import check_append_replay

    for answer in (None, ..., "no", 0):
        verdict = check_append_replay(answer, "127.0.0.1:1")  # never reached: nothing runs
        assert not verdict.passed and "True" in verdict.message and "False" in verdict.message
