"""12 · your own pipeline: the learner's app directory does not outlive the kernel; an app that
is not a function, or asks for what the harness does not give, is answered before a run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_the_app_directory_is_removed_when_the_kernel_exits():
    code = ("from labkit.exercises import own_pipeline\n"
            "d = own_pipeline.workdir(); (d / 'my_app.py').write_text('print(1)'); print(d)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    directory = Path(out.stdout.strip())
    assert directory.name.startswith("own-pipeline-")
    assert not directory.exists()


def test_a_killed_kernels_directory_goes_with_the_next_one(tmp_path, monkeypatch):
    import tempfile

    from labkit.exercises import own_pipeline

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / f"own-pipeline-{dead}-abc123"
    stale.mkdir()
    (stale / "my_app.py").write_text("print(1)")
    live = tmp_path / f"own-pipeline-{os.getpid()}-def456"  # this process: still running
    live.mkdir()
    fresh = own_pipeline.workdir()
    assert fresh.parent == tmp_path and fresh.name.startswith(f"own-pipeline-{os.getpid()}-")
    assert not stale.exists() and live.exists()


def test_the_verdict_lines_name_a_stall_only_in_a_run_that_had_one():
    from labkit.checking.record import RunRecord
    from labkit.experiments.stall_clock import Stall
    from labkit.checking.audit import AuditReport
    from labkit.exercises import own_pipeline

    report = AuditReport("torture", "unknown", produced=200, delivered_unique=200,
                         aborted_in_log=20)
    calm = RunRecord("torture", report, facts={"kills": 3, "restarts": 3, "stalls": []})
    assert own_pipeline.verdict_lines(calm) == "\n".join([
        "kills: 3, restarts: 3",
        "input records: 200, every one in the output: True",
        "lost > 0: False",
        "duplicated > 0: False",
        "verdict: exactly once",
    ])
    stall = Stall(after_s=2.5, stalled_s=8.2, consumed=60, end=200, written=80,
                  attempt=1)
    hung = RunRecord("torture", report, facts={"kills": 0, "restarts": 1, "stalls": [stall]})
    lines = own_pipeline.verdict_lines(hung).splitlines()
    assert lines[:2] == ["kills: 0, restarts: 1", "stalled: 1"]
    assert lines[2:] == own_pipeline.verdict_lines(calm).splitlines()[1:]


def test_an_app_the_harness_cannot_run_is_answered_before_anything_runs(tmp_path):
    from labkit.exercises import own_pipeline
    from tests.notebook_cells import as_cell

    assert "must be your app's function" in own_pipeline.check_own_pipeline("import os", tmp_path).message
    asks = as_cell("def my_fixed_app(bootstrap, input_topic, output_topic, group_id, "
                   "partition):\n    pass\n", "my_fixed_app")
    refused = own_pipeline.check_own_pipeline(asks, tmp_path)
    assert not refused.passed and "asks for ['partition']" in refused.message, refused.message
    assert (tmp_path / "my_fixed_app.py").read_text().startswith("def my_fixed_app(")
