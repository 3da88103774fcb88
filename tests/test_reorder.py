"""Reordering on retry, on the real broker: the fault proxy answers the 3rd Produce request
itself with a retriable error once the 4th is on its way. Without idempotence the retried
batch lands behind the 4th (the checker counts its 2 payments out of order, every run); with
idempotence the broker refuses the 4th's sequence and the client resends both in order."""
from __future__ import annotations

import json
import subprocess

import pytest

from labkit import experiments
from labkit.experiments import reorder
from labkit.faults.faultspec import parse_fault_spec
from tests.test_failover import LABKIT, refused_before_any_broker


@pytest.mark.parametrize("idempotent, reordered, resent", [
    (False, reorder.BATCH, range(1, 2)),  # 10 batches; only the failed one sent again
    (True, 0, range(2, 6)),  # the 4th (and any later one in flight) refused for its sequence gap, sent again too
])
def test_a_failed_request_behind_a_later_one_reorders_only_without_idempotence(
        bootstrap, idempotent, reordered, resent):
    for _ in range(2):  # the same counts every run
        run = experiments.run("reorder", cluster=bootstrap, idempotent=idempotent, records=20)
        r = run.report
        assert (r.lost, r.duplicated, r.reordered) == (0, 0, reordered), r.summary()
        assert run.failed == 1 and run.produce_requests - 10 in resent, run.to_json()
        assert run.produce_errors == (["NOT_LEADER_OR_FOLLOWER", "OUT_OF_ORDER_SEQUENCE_NUMBER"]
                                      if idempotent else ["NOT_LEADER_OR_FOLLOWER"]), run.to_json()


def test_the_fail_fault_is_for_produce_only():
    assert parse_fault_spec("fail:produce:3").nth == 3
    with pytest.raises(ValueError, match="fail answers a Produce request"):
        parse_fault_spec("fail:fetch:1")


def test_the_cli_runs_it_and_refuses_what_it_cannot_run(bootstrap, tmp_path):
    refused_before_any_broker(tmp_path, "reorder", [
        ([], "choose --idempotent or --no-idempotent"),
        (["--idempotent", "-g", "exactly_once"], "No such option"),
        (["--no-idempotent", "--records", "4"], "records must be 8 or more"),
        (["--fencing", "group"], "No such option: --fencing"),
    ])
    refused_before_any_broker(tmp_path, "consumer", [(["--idempotent"], "No such option: --idempotent")])
    out = subprocess.run([str(LABKIT), "scenario", "reorder", "--no-idempotent", "--records",
                          "20", "--json"], capture_output=True, text=True, timeout=120,
                         env={"LABKIT_HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
                              "LABKIT_BOOTSTRAP": bootstrap})
    run = json.loads(out.stdout)
    assert (run["scenario"], run["reordered"], run["idempotent"]) == ("reorder", 2, False), out.stderr
