"""A Flink run is plain data too (issue 50): its audit reads the output through
``labkit.checking.reads`` and names the fault from the history's ``fault`` entries (what
each aimed kill hit), so a stored run is checked again with no Kafka to the live report;
an edited read gives another verdict."""
from __future__ import annotations

import pytest
from labkit import experiments
from labkit.checking import stored
from labkit.experiments.recheck import recheck
from tests.test_stored_runs import (_reads, checked_again, drop_one_read,  # noqa: F401
                                    kafka_forbidden, no_kafka)  # a fixture

pytestmark = pytest.mark.flink


def test_a_stored_flink_run_is_checked_again_without_kafka(bootstrap, tmp_path, no_kafka):
    run = experiments.run("flink-crash", cluster=bootstrap, guarantee="at_least_once",
                          kill_at="mid-checkpoint")
    assert run.report.duplicated > 0 and run.report.lost == 0, run.summary()
    assert run.report.fault == run.kills[0].describe()
    path = run.store(tmp_path / "flink.jsonl")
    (at,) = _reads(path)

    checked_again(run, path, no_kafka)  # the fault named as it was live, too

    # a record read once by the audited (read_committed) reader, gone from the stored read
    once = drop_one_read(path, at)
    with kafka_forbidden(no_kafka):
        edited = recheck(stored.load(path))
    assert edited.report.lost == 1 and edited.report.examples["lost"] == [once]
    assert edited.verdict != run.verdict
