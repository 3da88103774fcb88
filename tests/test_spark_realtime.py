"""The `spark-realtime` experiment on real Spark 4.2 and the real broker: the same Kafka-to-Kafka
query (Spark's official Kafka source and sink) in real-time mode and as a micro-batch, its
driver SIGKILLed mid-batch and restarted on its checkpoint. Judged from the topics.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from labkit import experiments
from labkit.kafka import topics
from labkit.pipelines.learner import LearnerCodeError, from_text
from labkit.spark import realtime
from labkit.spark.runner import SparkJobError
from tests.test_failover import LABKIT
from tests.test_stored_runs import checked_again, no_kafka  # noqa: F401 (a fixture)
from tests.test_txn_timeout import started_for

pytestmark = pytest.mark.spark

def test_a_real_time_query_killed_mid_batch_writes_its_batch_again_and_a_dedupe_repairs_it(
        bootstrap, tmp_path, no_kafka):
    run = experiments.run("spark-realtime", cluster=bootstrap, trigger="5 seconds")
    try:
        assert run.trigger == "RealTimeTrigger(5000)"
        # killed 2.5 s after the first checkpoint of a 5 s batch: mid-batch
        assert 1.0 < run.killed_after_checkpoint_s < 5.0, run.timeline()
        # read back from Kafka here, not from the run's own frame
        written = {r.value["id"] for r in topics.read(bootstrap, run.topics["input"])}
        assert len(written) == run.report.produced > 0
        ids = [r.value["id"] for r in topics.read(bootstrap, run.topics["output"])]
        assert set(ids) == written  # nothing lost
        assert len(ids) - len(set(ids)) == run.report.duplicated > 0
        # each copy is one the killed driver wrote and its restart wrote again, as its
        # summary says beside the audit's count
        assert run.rewritten == run.report.duplicated, run.summary()
        assert run.deduped.exactly_once and run.deduped.duplicated == 0
        assert 0 <= run.latency["p50_ms"] <= run.latency["p99_ms"]  # measured, one clock
        # stored and checked again without Kafka (issue 50): both topics' reads and the
        # kill's fault entry, all in the history, give the live verdict and the dedupe's
        again = checked_again(run, run.store(tmp_path / "realtime.jsonl"), no_kafka)
        assert again.facts["deduped"].to_dict() == run.deduped.to_dict()
    finally:
        run.cleanup()


def test_the_cli_runs_a_micro_batch_and_leaves_no_spark_behind(bootstrap):
    out = subprocess.run([str(LABKIT), "scenario", "spark-realtime", "--trigger", "micro-batch",
                          "--json"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "LABKIT_BOOTSTRAP": bootstrap})
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["trigger"] == "ProcessingTimeTrigger(0)"
    assert result["produced"] == result["delivered_unique"] > 0
    assert result["lost"] == 0 and result["deduped_duplicated"] == 0
    assert started_for(bootstrap) == []  # no Spark driver or JVM outlives the CLI


def test_spark_refuses_a_real_time_batch_under_5_seconds_and_the_error_says_so(bootstrap,
                                                                                monkeypatch):
    created: list[str] = []
    create = topics.create
    monkeypatch.setattr(topics, "create", lambda b, *names, **kw: (created.extend(names),
                                                                     create(b, *names, **kw)))
    with pytest.raises(SparkJobError, match="INVALID_STREAMING_REAL_TIME_MODE_TRIGGER_INTERVAL"):
        experiments.run("spark-realtime", cluster=bootstrap, trigger="2 seconds")
    assert len(created) == 2 and not set(created) & set(topics.listing(bootstrap))


def test_a_query_asking_for_what_the_worker_does_not_give_is_refused_before_spark_starts():
    query = from_text("def wrong(spark, topic):\n    return None\n", "wrong", "<test wrong>")
    with pytest.raises(LearnerCodeError, match="topic"):
        realtime.check_query(query)
    with pytest.raises(ValueError, match="leave trigger= out"):
        experiments.run("spark-realtime", cluster="localhost:1",
                        pipeline=realtime.reference_query("5 seconds"), trigger="5 seconds")


SHOWN = realtime.reference_query("5 seconds")


def test_the_exercise_hints_without_a_run_for_the_query_as_shown_and_measures_a_changed_one(
        bootstrap):
    from labkit.exercises.spark_realtime import check_keyed_query

    same = from_text(realtime.REFERENCE.replace("TRIGGER", '\n            .trigger(realTime="5 seconds")')
                     .replace("def copy_query(", "def keyed_query("), "keyed_query",
                     "<test keyed_query>")
    verdict = check_keyed_query(same, SHOWN, bootstrap)
    assert not verdict.passed and "still copies the record key" in verdict.message
    # changed, but every payment of an account still shares its key: measured, then a hint
    by_account = from_text(realtime.REFERENCE.replace(
        'payments.select("key", "value")',
        'payments.select(F.get_json_object(F.col("value").cast("string"), "$.key")'
        '.alias("key"), "value")').replace("TRIGGER", "").replace(
        "def copy_query(", "def keyed_query("), "keyed_query", "<test by account>")
    verdict = check_keyed_query(by_account, SHOWN, bootstrap)
    assert not verdict.passed and "share a key" in verdict.message
    assert "$.id" not in verdict.message  # a hint, never the answer
