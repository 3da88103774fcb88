"""`labkit torture --schedule production`: an app under the judge's faults (the same fault
objects, labkit.faults.production), several instances in one group, each with its own
transactional id and member id, the input arriving while they work."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.test_harness import APPS, LABKIT, no_process_left_behind  # noqa: F401 (autouse)


def test_an_exactly_once_app_under_productions_faults(bootstrap):
    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap}
    out = subprocess.run([str(LABKIT), "torture", "--schedule", "production", "--instances",
                          "2", "--partitions", "4", "--kills", "0", "--records", "600",
                          "--seed", "2", "--timeout", "240", "--json", "--",
                          sys.executable, str(APPS / "exactly_once_app.py")],
                         capture_output=True, text=True, env=env, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    d = json.loads(out.stdout)
    assert d["verdict"] == "exactly once", d
    assert (d["lost"], d["duplicated"], d["stalled"], d["notes"]) == (0, 0, 0, []), \
        (d["stalls"], d["waited"], d["notes"], d["faults_fired"], out.stderr[-4000:],
         [Path(s["stacks"]).read_text()[-6000:] for s in d["stalls"] if s["stacks"]])
    fired = " ".join(d["faults_fired"])
    for what in ("SIGKILLed as it sent EndTxn", "SIGKILLed as it sent Produce", "joins",
                 "leaves", "frozen", "thawed", "transactional", "refused", "lost"):
        assert what in fired, (what, d["faults_fired"])
    # the wire faults landed, as the proxy counted: an ack lost, a record and the offsets refused
    wire = d["fault_stats"]
    assert (wire["responses_dropped"], wire["responses_errored"], wire["senders_killed"]) \
        == (1, 2, 2), wire
    assert d["aborted_in_log"] > 0, d  # the transactions its faults aborted, read committed
