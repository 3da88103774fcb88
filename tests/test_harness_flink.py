"""A PyFlink job under `labkit torture`, as any app: the harness SIGKILLs it at random moments
after its checkpoints, each start restores the latest retained checkpoint
(``python -m labkit.torture.apps flink``), and the audit reads the output read_committed.

Why the kills land mid-stream: the job does WORK_MS of work per payment, so its INPUT
payments take about 15 s, many checkpoints (INTERVAL_MS); a kill comes KILL_AFTER_S after
the first offset commit of a start (``kill_clock="commit"``: the source commits its offsets
when a checkpoint completes), while it still has input to read. Less work did not do for
two kills: with 300 payments (6 s), or 2000 at 5 ms, the input was consumed before the
second kill came (measured). The source commits a checkpoint's offsets between its consumer's polls only, and
a poll that finds nothing new waits up to 10 s (labkit.flink.consumed), so a restarted job
that has fetched the rest of its input commits late.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from labkit.torture import apps, harness

pytestmark = pytest.mark.flink

INPUT = 1500
KILLS = 1  # a second kill costs a restart (10-20 s here) and shows nothing more
WORK_MS = 10  # 1500 payments: 15 s of work, 30 checkpoints
INTERVAL_MS = 500
KILL_AFTER_S = (0.5, 1.5)


def test_torture_finds_a_pyflink_exactly_once_job_exact(cluster):
    run = harness.torture(apps.flink_command("exactly_once", interval_ms=INTERVAL_MS,
                                             work_ms=WORK_MS),
                          records=INPUT, kills=KILLS, seed=1, kill_clock="commit",
                          kill_after=KILL_AFTER_S, timeout=300, stall_s=150,
                          cluster=cluster)
    assert (run.kills, run.restarts) == (KILLS, KILLS), run.summary()
    assert run.report.produced == INPUT
    assert (run.report.lost, run.report.duplicated) == (0, 0), run.summary()
    assert run.verdict == "exactly once", run.summary()
    # the kills hit open transactions: their records are in the log, aborted, unread
    # (else: when its starts, kills and the group's commits came, to see where the kill fell)
    when = [(e["kind"], round(e["t"], 1), e.get("committed"), e.get("end")) for e in run.history
            if e["kind"] in ("started", "killed", "exited", "progress")]
    assert run.report.aborted_in_log > 0, (run.summary(), when)
    # each start after the first restored a checkpoint, as its first line says
    logs = sorted(Path(run.run_dir).glob("*.log"))  # each start's output
    restored = [line for log in logs for line in log.read_text().splitlines()
                if line.startswith("start-") and "restoring checkpoint" in line]
    assert len(restored) == KILLS, restored


def test_the_flink_app_refuses_an_unknown_guarantee():
    with pytest.raises(harness.HarnessError, match="unknown delivery guarantee 'exactly-once'"):
        apps.flink_command("exactly-once")


def test_the_lab_job_slowed_for_torture_keeps_its_fee():
    from labkit.flink import app

    code = app.slowed(20)
    assert code.count("time.sleep(0.02)") == 1 and "import time\n" in code
    assert "def add_fee(value: str) -> str:" in code  # the rest of the job is the lab's
