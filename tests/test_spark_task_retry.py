"""Task-retry duplicates (issue 13, item 3): not a driver crash but one failed task.

The crash point ``spark-task-first-attempt`` makes the task writing input partition 0 of the
2nd micro-batch's Kafka write fail on its first attempt, after half its rows went out. Spark
(local[2,4]: up to 4 attempts per task, like spark.task.maxFailures on a cluster) retries the
task, which sends the whole partition again: at-least-once within one micro-batch, with no
restart and no replay of the batch. Downstream dedupe by id repairs it.
"""
from __future__ import annotations

import pytest

from labkit.kafka import topics
from labkit.spark import check
from labkit import experiments
from labkit.spark.scenarios import validate

RECORDS = 60
POINT = "spark-task-first-attempt"


def test_the_task_failure_point_belongs_to_the_kafka_sink_only():
    assert validate("spark-kafka-sink", "at_least_once", POINT, RECORDS) == "kafka"
    with pytest.raises(ValueError, match="use it with spark-kafka-sink"):
        validate("spark-naive", "at_least_once", POINT, RECORDS)


@pytest.mark.spark
def test_a_retried_task_duplicates_its_partition_and_dedupe_removes_it(bootstrap, tmp_path):
    exp = experiments.run("spark-kafka-sink", cluster=bootstrap,
                          guarantee="at_least_once", crash_at=POINT,
                          records=RECORDS, workdir=tmp_path, spare=False)
    # The driver never died: one attempt, every batch committed once, no batch replayed.
    (attempt,) = exp.run.attempts
    assert not attempt.crashed and attempt.checkpoint["committed"].all()
    assert not exp.run.timeline["replay"].any()
    r = exp.report
    # Batch 2's first half is 10 rows of input partition 0 (offsets 11-20): its task sent 5,
    # failed, and its retry sent all 10.
    assert (r.lost, r.duplicated, r.delivered_unique) == (0, 5, RECORDS)
    assert len(exp.output) == RECORDS + r.duplicated  # the copies are in the output topic
    # Every copy came from one input partition: the one whose task was retried.
    partition_of = {rec.value["id"]: rec.partition for rec in topics.read(bootstrap, exp.job.topic)}
    counts = exp.output["id"].value_counts()
    assert {partition_of[i] for i in counts[counts > 1].index} == {0}
    deduped = check.dedupe_by_id(exp.output)
    fixed = check.audit_output("spark-kafka-sink + dedupe", "exactly_once", POINT, exp.inputs,
                               deduped, r.state_expected)
    assert (fixed.lost, fixed.duplicated, fixed.reordered) == (0, 0, 0) and fixed.exactly_once
