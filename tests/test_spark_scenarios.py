"""Every Spark sink under every Spark crash point, on the real broker and real Spark.

Each test runs one scenario: 60 records in 3 micro-batches, SIGKILL of the driver process
(and so its JVM) in or after the 2nd batch, restart from the checkpoint (or, for the
transactional sink, from the offsets in the database), then the audit.
"""
from __future__ import annotations

import json

import pytest

from labkit.checking import audit, stored
from labkit.experiments.recheck import recheck
from labkit.proc import pid_alive
from labkit.spark import check
from labkit import experiments
from tests.test_stored_runs import (_reads, checked_again, kafka_forbidden,  # noqa: F401
                                    no_kafka)  # a fixture

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


def stored_run_checks_again(run, path, no_kafka: str, monkeypatch) -> None:
    """A Spark run is plain data too (issue 50): its sink's table and a Spark batch recount
    of the input are kept in the history, so the stored run is checked again with no Kafka,
    database or Spark to the live verdict; a row dropped from the stored table gives
    another one."""
    run.store(path)
    (at,) = _reads(path, "table-read")
    assert len(_reads(path, "kept")) == 1  # the recount: counts per key, not the records
    lines = path.read_text().splitlines()
    entry = json.loads(lines[at])
    assert len(entry["rows"]) == run.report.delivered_unique + run.report.duplicated
    assert len(lines) - 1 > 2  # the query's own events are kept beside the checker's reads

    def refuse(*args, **kwargs):
        raise AssertionError(f"a re-check ran Spark: {args}")
    monkeypatch.setattr(check, "recount", refuse)
    checked_again(run, path, no_kafka)

    ids = [row[entry["columns"].index("id")] for row in entry["rows"]]
    once = next(i for i in ids if ids.count(i) == 1)  # a row the sink holds once
    entry["rows"] = [row for row, i in zip(entry["rows"], ids) if i != once]
    lines[at] = json.dumps(entry)
    path.write_text("\n".join(lines) + "\n")
    with kafka_forbidden(no_kafka):
        edited = recheck(stored.load(path))
    assert edited.report.lost == 1 and edited.report.examples["lost"] == [str(once)]
    assert edited.report.duplicated == run.report.duplicated
    assert edited.verdict != run.verdict


@pytest.mark.parametrize("point", POINTS)
def test_naive_sink_duplicates_what_the_replay_rewrites(bootstrap, tmp_path, point, no_kafka,
                                                        monkeypatch):
    exp = _crashed_and_finished(bootstrap, tmp_path, "spark-naive", "at_least_once", point)
    if point == "spark-after-sink-before-commit":
        stored_run_checks_again(exp, tmp_path / "spark.jsonl", no_kafka, monkeypatch)
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
