"""A Spark run is plain data too (issue 50): its sink's audit reads the sink's table and
a Spark batch recount of the input through ``labkit.checking.reads``, so a stored run is
checked again with no Kafka, no database and no Spark, to the live verdict; an edited read
gives another one."""
from __future__ import annotations

import json

import pytest

from labkit import experiments
from labkit.checking import stored
from labkit.experiments.recheck import recheck
from labkit.spark import check
from tests.test_stored_runs import (_reads, checked_again, kafka_forbidden,  # noqa: F401
                                    no_kafka)  # a fixture

pytestmark = pytest.mark.spark


def test_a_stored_spark_run_is_checked_again_without_kafka_or_spark(bootstrap, tmp_path,
                                                                    no_kafka, monkeypatch):
    run = experiments.run("spark-naive", cluster=bootstrap, guarantee="at_least_once",
                          crash_at="spark-after-sink-before-commit", records=30)
    assert run.report.duplicated > 0 and run.report.lost == 0, run.summary()
    path = run.store(tmp_path / "spark.jsonl")
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

    # a row the sink holds once, gone from the stored read: lost, so another verdict
    ids = [row[entry["columns"].index("id")] for row in entry["rows"]]
    once = next(i for i in ids if ids.count(i) == 1)
    entry["rows"] = [row for row, i in zip(entry["rows"], ids) if i != once]
    lines[at] = json.dumps(entry)
    path.write_text("\n".join(lines) + "\n")
    with kafka_forbidden(no_kafka):
        edited = recheck(stored.load(path))
    assert edited.report.lost == 1 and edited.report.examples["lost"] == [str(once)]
    assert edited.report.duplicated == run.report.duplicated
    assert edited.verdict != run.verdict
