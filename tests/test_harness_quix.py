"""quixstreams (https://quix.io), software no one here wrote, under `labkit torture`: the same
seeded kills give duplicates with processing_guarantee="at-least-once" and none with
"exactly-once", and lose nothing either way.

quixstreams 3.28 needs confluent-kafka < 2.13 while the lab pins 2.16.1: the app runs in an
environment of its own, created here on first use under .cache/apps (a fresh clone's
`make test` creates it; later runs reuse it).

Why the outcome is fixed, not lucky: the app commits every COMMIT_INTERVAL_S (8 s) after it
starts, and each kill lands KILL_AFTER_S (3.5-6 s) after a start: after the app has read
and written its whole (small) input, before its first commit. So every kill replays
everything the killed start wrote: at-least-once writes it again, exactly-once's open
transaction is aborted (its records stay in the log, invisible to read_committed).
"""
from __future__ import annotations

import subprocess

import pytest

from labkit.torture import apps, harness
from labkit.checking.record import RunRecord

INPUT = 500
KILLS = 2
SEED = 1
COMMIT_INTERVAL_S = 8.0
KILL_AFTER_S = (3.5, 6.0)


@pytest.fixture(scope="module")
def quix_runs(cluster) -> dict[str, RunRecord]:
    return {g: harness.torture(apps.quix_command(g, COMMIT_INTERVAL_S), records=INPUT,
                               kills=KILLS, seed=SEED, kill_after=KILL_AFTER_S,
                               timeout=180, cluster=cluster)
            for g in apps.QUIX_GUARANTEES}


def test_quixstreams_at_least_once_duplicates_and_exactly_once_does_not(quix_runs):
    alo, eos = quix_runs["at-least-once"], quix_runs["exactly-once"]
    for result in (alo, eos):  # the same seeded kills landed on both
        assert (result.kills, result.restarts) == (KILLS, KILLS), result.summary()
        assert result.report.produced == INPUT
        assert (result.report.lost, result.report.delivered_unique) == (0, INPUT), result.summary()
    # at-least-once: what each killed start wrote is written again after the restart.
    assert alo.report.duplicated > 0, alo.summary()
    assert alo.verdict == "at least once"
    assert alo.anomalies()["duplicate"]["count"] == alo.report.duplicated
    assert alo.report.aborted_in_log == 0  # no transactions: nothing aborted
    # exactly-once: the killed starts' output was in open transactions, aborted in the log
    # (read_uncommitted sees it) and invisible to the verdict (read_committed).
    assert eos.report.duplicated == 0 and eos.anomalies() == {}, eos.summary()
    assert eos.verdict == "exactly once"
    assert eos.report.aborted_in_log > 0, eos.summary()


def test_quixstreams_runs_in_its_own_pinned_environment():
    python = apps.app_env("quixstreams", apps.QUIX_REQUIREMENTS)  # reused, not rebuilt
    assert python.parent.parent.name == "quixstreams-venv"
    assert list(python.parent.parent.glob(".installed-*")), "no stamp: it would be rebuilt"
    out = subprocess.run([str(python), "-c", "from importlib.metadata import version as v; "
                          "print(v('quixstreams'), v('confluent-kafka'))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3.28.1", "2.12.2"]  # not the lab's confluent-kafka 2.16.1
