"""A torture run is plain data too (issue 50): the contract's audit reads the app's output
through ``labkit.checking.reads``, so a stored ``labkit torture`` run is checked again with no
Kafka to the live verdict; an edited read gives another one."""
from __future__ import annotations

import sys

from labkit.checking import stored
from labkit.checking.checkers import EXAMPLES
from labkit.experiments.recheck import recheck
from labkit.paths import project_root
from labkit.torture import harness
from tests.test_stored_runs import (_reads, checked_again, drop_one_read,  # noqa: F401
                                    kafka_forbidden, no_kafka)  # a fixture

COMMIT_FIRST = [sys.executable, str(project_root() / "examples" / "torture" /
                                    "commit_first_app.py"), "--work-ms", "5"]


def test_a_stored_torture_run_is_checked_again_without_kafka(bootstrap, tmp_path, no_kafka):
    run = harness.torture(COMMIT_FIRST, records=300, kills=2, seed=1, cluster=bootstrap,
                          kill_clock="commit", kill_after=(0.3, 1.0))
    assert run.kills == 2, run.summary()
    path = run.store(tmp_path / "torture.jsonl")
    (at,) = _reads(path)

    checked_again(run, path, no_kafka)

    # a record read once by the audited (read_committed) reader, gone from the stored read
    once = drop_one_read(path, at)
    with kafka_forbidden(no_kafka):
        edited = recheck(stored.load(path))
    assert edited.report.lost == run.report.lost + 1
    assert once in edited.report.examples["lost"] or run.report.lost >= EXAMPLES
    assert edited.report.delivered_unique == run.report.delivered_unique - 1
