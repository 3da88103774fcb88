"""Every Spark sink under every Spark crash point, on the real broker and real Spark.

Each test runs one scenario: 60 records in 3 micro-batches, SIGKILL of the driver process
(and so its JVM) in or after the 2nd batch, restart from the checkpoint (or, for the
transactional sink, from the offsets in the database), then the audit.
"""
from __future__ import annotations

import pytest

from labkit.checking import audit
from labkit.proc import pid_alive
from labkit.spark import check
from labkit import experiments

pytestmark = pytest.mark.spark

RECORDS = 60
BATCH = 20
POINTS = ["spark-mid-sink", "spark-after-sink-before-commit", "spark-after-commit"]
# What a replay of the 2nd batch duplicates for an at-least-once sink: half a batch after a
# crash mid-sink, the whole batch after a crash between sink and commit, nothing after commit.
REPLAYED = {"spark-mid-sink": BATCH // 2, "spark-after-sink-before-commit": BATCH,
            "spark-after-commit": 0}


def _crashed_and_finished(bootstrap, tmp_path, name: str, guarantee: str, point: str):
    """Run the scenario; check the crash really killed driver and JVM and the restart finished."""
    exp = experiments.run(name, cluster=bootstrap, guarantee=guarantee, crash_at=point,
                          records=RECORDS, workdir=tmp_path)
    first, last = exp.run.attempts[0], exp.run.attempts[-1]
    assert first.crashed and first.crash_at == point and first.returncode == -9
    # The JVM died with its driver (the gateway pipe closed); no orphan left behind.
    assert first.jvm_exit_s is not None and not pid_alive(first.jvm_pid)
    assert not last.crashed and last.checkpoint["committed"].all()
    return exp


@pytest.mark.parametrize("point", POINTS)
def test_naive_sink_duplicates_what_the_replay_rewrites(bootstrap, tmp_path, point):
    exp = _crashed_and_finished(bootstrap, tmp_path, "spark-naive", "at_least_once", point)
    r = exp.report
    assert (r.produced, r.lost, r.duplicated) == (RECORDS, 0, REPLAYED[point])
    assert r.delivered_unique == RECORDS
    assert r.state_matches is (REPLAYED[point] == 0)
    assert r.reordered == 0 and r.verdict == ("at least once" if REPLAYED[point] else "exactly once")
    timeline = exp.run.timeline
    replayed = timeline[timeline["replay"]]
    if point == "spark-after-commit":
        assert replayed.empty  # batch 1 was committed: the restart goes on with batch 2
    else:
        assert list(replayed["batch_id"]) == [1]  # the uncommitted batch ran again


@pytest.mark.parametrize("point", POINTS)
def test_idempotent_sink_is_exactly_once(bootstrap, tmp_path, point):
    exp = _crashed_and_finished(bootstrap, tmp_path, "spark-idempotent", "exactly_once", point)
    r = exp.report
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated) == (RECORDS, RECORDS, 0, 0)
    assert r.state_expected == r.state_actual and r.reordered == 0 and r.exactly_once
    if point != "spark-after-commit":
        assert exp.run.timeline["replay"].any()  # the batch did replay; the upsert absorbed it


@pytest.mark.parametrize("point", POINTS)
def test_transactional_sink_resumes_from_database_offsets(bootstrap, tmp_path, point):
    exp = _crashed_and_finished(bootstrap, tmp_path, "spark-transactional", "exactly_once", point)
    r = exp.report
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated) == (RECORDS, RECORDS, 0, 0)
    # Order as the table's own sequence shows it: the restart's batch ids start again at 0,
    # its rows still come after the 1st and 2nd batch's (ordering by batch id reported 18).
    assert r.reordered == 0 and r.exactly_once
    first, second = exp.run.attempts
    # The restart started a new checkpoint at the offsets the database committed: after the
    # 1st batch for a crash mid-sink (rolled back), after the 2nd otherwise.
    assert second.starting_offsets.startswith("{")
    committed_before = BATCH if point == "spark-mid-sink" else 2 * BATCH
    assert second.checkpoint["records"].sum() == RECORDS - committed_before
    # Only the range a crash mid-sink rolled back is read again; the others are never re-read.
    replayed = exp.run.timeline.query("replay")
    assert len(replayed) == (1 if point == "spark-mid-sink" else 0)


@pytest.mark.parametrize("point", POINTS)
def test_kafka_sink_duplicates_and_downstream_dedupe_removes_them(bootstrap, tmp_path, point):
    exp = _crashed_and_finished(bootstrap, tmp_path, "spark-kafka-sink", "at_least_once", point)
    r = exp.report
    assert (r.lost, r.duplicated, r.delivered_unique) == (0, REPLAYED[point], RECORDS)
    assert len(exp.output) == RECORDS + REPLAYED[point]  # copies really are in the topic
    deduped = check.dedupe_by_id(exp.output)
    fixed = check.audit_output("spark-kafka-sink", "exactly_once", point, exp.inputs, deduped,
                               r.state_expected)
    assert (fixed.lost, fixed.duplicated, fixed.reordered) == (0, 0, 0) and fixed.exactly_once


@pytest.mark.parametrize("point", POINTS)
def test_running_count_in_state_store_matches_batch_recount(bootstrap, tmp_path, point):
    exp = _crashed_and_finished(bootstrap, tmp_path, "spark-running-count", "exactly_once", point)
    r = exp.report
    # the Spark batch recount of the input topic agrees with the generator's own counts
    assert r.state_expected == audit.expected_counts(exp.inputs)
    assert r.state_actual == r.state_expected and (r.lost, r.duplicated) == (0, 0)
    # The restart restored the state store from the checkpoint (one version per batch).
    from labkit.spark import checkpoint as ckpt
    versions = ckpt.state_versions(exp.job.checkpoint)
    assert set(versions["version"]) >= {1, 2, 3}


def test_increment_count_over_counts_after_replay(bootstrap, tmp_path):
    exp = experiments.run("spark-running-count", cluster=bootstrap,
                          guarantee="at_least_once",
                          crash_at="spark-after-sink-before-commit",
                          records=RECORDS, workdir=tmp_path)
    r = exp.report
    # Batch 2's per-key counts were added twice: exactly one batch worth of over-count.
    assert (r.lost, r.duplicated) == (0, BATCH) and not r.state_matches
    assert r.verdict == "at least once"  # the drift is explained by the over-count
