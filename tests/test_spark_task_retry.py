"""Task-retry duplicates (issue 13, item 3): not a driver crash but one failed task.

The crash point ``spark-task-first-attempt`` makes the task writing input partition 0 of the
2nd micro-batch's Kafka write fail on its first attempt, after half its rows went out. Spark
(local[2,4]: up to 4 attempts per task, like spark.task.maxFailures on a cluster) retries the
task, which sends the whole partition again: at-least-once within one micro-batch, with no
restart and no replay of the batch. Downstream dedupe by id repairs it.

The failure is put around whichever sink writes the batch: the lab's, or the learner's
``foreachBatch`` function (``pipeline=``). The experiment itself runs once, in notebook 08b
(section 2) with the notebook's own ``kafka_sink``, whose compared output is the check: one
query attempt, no driver crash, no batch replayed, 5 of 60 duplicated, all from input
partition 0, none after a dedupe by id. It ran here a second time until the suite had to
fit its 30 minutes.
"""
from __future__ import annotations

import pytest

from types import SimpleNamespace

from labkit.spark.scenarios import check_sink, validate
from tests.notebook_cells import as_cell, read

RECORDS = 60
POINT = "spark-task-first-attempt"


def test_the_task_failure_point_belongs_to_the_kafka_sink_only():
    assert validate("spark-kafka-sink", "at_least_once", POINT, RECORDS) == "kafka"
    with pytest.raises(ValueError, match="use it with spark-kafka-sink"):
        validate("spark-naive", "at_least_once", POINT, RECORDS)


def test_a_learners_kafka_sink_takes_the_task_failure():
    """08b's section 2 runs the kafka_sink of its section 1 under the task failure: the lab
    checks it like any learner's sink, and does not refuse it."""
    (cell,) = [c.source for c in read("08b_spark_kafka_in_and_out").cells
               if c.cell_type == "code" and "def kafka_sink(" in c.source]
    check_sink(as_cell(cell, "kafka_sink"), SimpleNamespace(crash_at=POINT))
    (run,) = [c.source for c in read("08b_spark_kafka_in_and_out").cells
              if c.cell_type == "code" and f'crash_at="{POINT}"' in c.source]
    assert "pipeline=kafka_sink" in run
