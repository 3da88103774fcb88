"""12 · your own pipeline: the learner's app directory does not outlive the kernel."""
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
