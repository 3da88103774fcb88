"""Delta Lake's idempotent writes (txnAppId + txnVersion) against a plain Delta append, after
a real SIGKILL between the sink and Spark's commit log, judged from the Delta table itself.

30 records in 3 micro-batches of 10; the crash hits the 2nd batch after its Delta commit and
before Spark's commits/1, so the restart (from the checkpoint) replays batch 1.
"""
from __future__ import annotations

import pytest

from labkit.spark import delta, tables
from labkit import experiments

pytestmark = pytest.mark.spark

RECORDS, BATCH = 30, 10
POINT = "spark-after-sink-before-commit"


def _run(bootstrap, tmp_path, guarantee: str):
    exp = experiments.run("spark-delta", cluster=bootstrap, guarantee=guarantee,
                          crash_at=POINT, records=RECORDS, workdir=tmp_path)
    first, last = exp.run.attempts[0], exp.run.attempts[-1]
    assert first.crashed and first.returncode == -9 and not last.crashed
    timeline = exp.run.timeline  # from the checkpoint: batch 1's offset range ran twice
    assert list(timeline.loc[timeline["replay"], "batch_id"]) == [1]
    records, history = tables.read_table(exp.job.sink.path)
    return exp, records, history


def test_txn_version_skips_the_replayed_batch(bootstrap, tmp_path):
    exp, records, history = _run(bootstrap, tmp_path, "exactly_once")
    r = exp.report
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated, r.reordered) == (RECORDS, RECORDS, 0, 0, 0)
    assert r.state_matches and r.verdict == "exactly once"
    # The sink ran 4 times (batches 0, 1, 1 again, 2) but the table has 3 commits: the
    # replay of batch 1 made none. Each commit carries the txn entry (appId, batch id).
    assert list(history["version"]) == [0, 1, 2]
    assert list(history["operation"]) == ["WRITE"] * 3 and list(history["rows"]) == [BATCH] * 3
    assert set(history["txn_app_id"]) == {delta.app_id(exp.job.sink.table)}
    assert list(history["txn_version"]) == [0, 1, 2]
    assert records.groupby("delta_version").size().tolist() == [BATCH] * 3
    assert records["id"].is_unique


def test_plain_append_duplicates_the_replayed_batch(bootstrap, tmp_path):
    exp, records, history = _run(bootstrap, tmp_path, "at_least_once")
    r = exp.report
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated) == (RECORDS, RECORDS, 0, BATCH)
    assert r.verdict == "at least once"
    # 4 commits, no txn entries: the replay of batch 1 was appended as version 2, the same
    # ids as version 1.
    assert list(history["version"]) == [0, 1, 2, 3] and list(history["rows"]) == [BATCH] * 4
    assert (history["txn_app_id"] == "").all()
    by_version = records.groupby("delta_version")["id"].apply(set)
    assert by_version[1] == by_version[2] and len(by_version[1]) == BATCH


def test_exercise_hints_without_running():
    """A missing or malformed answer gets a hint at once (no Spark run, no answer given)."""
    from labkit.exercises.spark_replay import check_append_replay

    for answer in (None, ..., "no", 0):
        verdict = check_append_replay(answer, "127.0.0.1:1")  # never reached: nothing runs
        assert not verdict.passed and "True" in verdict.message and "False" in verdict.message
