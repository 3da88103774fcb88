"""A zombie nobody froze: instance A is slower than max.poll.interval.ms over one batch, its
client leaves the group for it, instance B (05b's loop) takes the input over; A then sends its
offsets. With its group metadata they are refused and A aborts; with the group id only its
commit goes through and its batch is duplicated. Measured on the real broker and group."""
from __future__ import annotations

import json
import subprocess

import pytest

from labkit.experiments import poll_zombie
from labkit.pipelines.fee_loop import BATCH
from tests.test_failover import LABKIT, refused_before_any_broker


@pytest.mark.parametrize("fencing, error, duplicated", [
    ("group", "UNKNOWN_MEMBER_ID (abortable)", 0),
    ("none", None, BATCH),
])
def test_a_batch_slower_than_the_poll_interval_makes_a_zombie(bootstrap, fencing, error, duplicated):
    run = poll_zombie.poll_interval_zombie(bootstrap, fencing, records=2 * BATCH)
    r = run.report
    assert (run.zombie_error, r.lost, r.duplicated, r.aborted_visible) == (error, 0, duplicated, 0), r.summary()
    # A was never frozen, only slower than its poll interval before it sent its offsets
    assert run.slow_s * 1000 >= poll_zombie.MAX_POLL_INTERVAL_MS


def test_the_cli_runs_it_and_refuses_bad_settings_before_starting_a_broker(bootstrap, tmp_path):
    refused_before_any_broker(tmp_path, "poll-interval-zombie", [
        (["--fencing", "epoch"], "fencing must be one of group, none"),
        (["--records", "5"], "records must be 20 or more"),
        (["-g", "at_least_once"], "No such option")])
    out = subprocess.run([str(LABKIT), "scenario", "poll-interval-zombie", "--records", "20", "--json"],
                         env={"LABKIT_HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
                              "LABKIT_BOOTSTRAP": bootstrap}, capture_output=True, text=True,
                         timeout=120)
    run = json.loads(out.stdout)
    assert (run["scenario"], run["zombie_error"], run["duplicated"]) == \
        ("poll-interval-zombie", "UNKNOWN_MEMBER_ID (abortable)", 0), out.stderr
