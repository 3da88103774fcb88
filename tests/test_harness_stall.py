"""`labkit torture` on an app that stops making progress while alive (a client call blocking
past its timeout, like librdkafka's send_offsets_to_transaction() after a broker restart):
the harness names the stall, restarts the app and still ends with the output's verdict; an
app that stalls at every start gets an error naming the stall. The app is the lab's exact
transactional app with --hang-after (it hangs inside a transaction, output written, offsets
not sent)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from labkit import cli
# no_process_left_behind: test_harness's autouse fixture, applied to these tests too

from labkit.pipelines import contract
from labkit.experiments import app_run, catalog
from labkit.torture import harness
from tests.test_harness import EXACT, LABKIT, no_process_left_behind  # noqa: F401


def history(run_dir: str) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "history.jsonl").read_text().splitlines()]


def group_gone(pgid: int) -> bool:
    """No process left in the process group the harness started for one attempt."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_an_app_that_stalls_once_is_restarted_and_judged_exactly_once(cluster, tmp_path):
    # The first start hangs after 3 transactions (60 of 300 records), its 4th left open.
    hangs_once = [*EXACT, "--hang-after", "3", "--hang-once", str(tmp_path / "hung")]
    result = harness.torture(hangs_once, records=300, kills=0, stall_s=5, timeout=90,
                             cluster=cluster)
    assert (result.kills, result.restarts, len(result.stalls)) == (0, 1, 1), result.summary()
    stall = result.stalls[0]
    assert (stall.attempt, stall.consumed, stall.end) == (1, 60, 300)
    assert 5 <= stall.stalled_s < 8 and 0 < stall.after_s < 30
    # The stall is a finding of its own; the verdict is the output's, after the restart
    # aborted the hung transaction.
    r = result.report
    assert result.verdict == "exactly once", result.summary()
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated) == (300, 300, 0, 0)
    assert result.seconds < 45  # not the run's timeout
    d = json.loads(result.to_json())
    assert (d["stalled"], d["restarts"], d["kills"], d["verdict"]) == (1, 1, 0, "exactly once")
    assert d["stalls"] == [{"after_s": stall.after_s, "stalled_s": stall.stalled_s,
                            "consumed": 60, "end": 300, "written": stall.written,
                            "attempt": 1, "stacks": stall.stacks}]
    assert f"stalled 1× (no progress for {stall.stalled_s:.0f} s after {stall.after_s:.1f} s; " \
           f"where it waited: {stall.stacks}; restarted)" in result.summary()
    # where it hung, read from outside before the restart: the app's sleep in its main loop
    stacks = Path(stall.stacks).read_text()
    assert "main (exactly_once_app.py:103)" in stacks and "time_sleep" in stacks, stacks
    events = history(result.run_dir)
    assert [e["kind"] for e in events].count("stalled") == 1
    # ... and in the run's history, beside what the cluster said then: whole (one broker),
    # the input with no transaction open, the group stable, the hung transaction Ongoing
    cluster, = [e for e in events if e["kind"] == "cluster"]
    assert (cluster["out_of_sync"], cluster["input_open"], cluster["group"]) == \
        ([], {}, "stable"), cluster
    assert list(cluster["transactions"].values()) == ["Ongoing"], cluster
    kept, = [e["text"] for e in events if e["kind"] == "stacks"]
    assert "main (exactly_once_app.py:103)" in kept
    pids = [e["pid"] for e in events if e["kind"] == "started"]
    assert len(pids) == 2 and all(group_gone(pid) for pid in pids)


def test_an_app_that_stalls_at_every_start_is_an_error_naming_the_stall(cluster):
    # Each start commits one transaction (20 of 300 records), then hangs: never done.
    hangs = [*EXACT, "--hang-after", "1"]
    started = time.monotonic()
    with pytest.raises(contract.HarnessError,
                        match=r"stalls every time it is started: 3 times[\s\S]*"
                              r"60 of 300 input offsets committed[\s\S]*hanging after 1") as exc:
        harness.torture(hangs, records=300, kills=0, stall_s=3, timeout=90, cluster=cluster)
    assert "--stall-s" in str(exc.value)
    assert time.monotonic() - started < 45  # three stalls, not the timeout


def test_the_cli_reports_the_stall_in_json_and_on_stderr(bootstrap, tmp_path):
    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap}
    hangs_once = [*EXACT, "--hang-after", "2", "--hang-once", str(tmp_path / "hung")]
    out = subprocess.run([str(LABKIT), "torture", "--records", "200", "--kills", "0",
                          "--stall-s", "4", "--json", "--", *hangs_once],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert (d["stalled"], d["restarts"], d["verdict"], d["lost"], d["duplicated"]) == \
        (1, 1, "exactly once", 0, 0)
    assert d["stalls"][0]["consumed"] == 40
    assert "app stalled: no commit and no output for 4 s since t=" in out.stderr
    assert "restarting it" in out.stderr


def test_the_stall_option_is_documented_and_checked():
    result = CliRunner().invoke(cli.app, ["torture", "--help"], env={"COLUMNS": "200"})
    assert "--stall-s" in result.output and "stalled" in result.output
    (default,) = [o.default for o in catalog()["torture"].options if o.flag == "--stall-s"]
    assert default == app_run.STALL_S
    with pytest.raises(contract.HarnessError, match="stall_s must be 1 or more"):
        harness.torture(EXACT, stall_s=0)
