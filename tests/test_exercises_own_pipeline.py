"""12 · your own pipeline: the learner's app directory does not outlive the kernel."""
from __future__ import annotations

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
