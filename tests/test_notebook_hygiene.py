"""The nbval run fails a notebook that leaves lab processes behind (see conftest.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


def test_a_notebook_that_leaks_a_worker_is_reported(tmp_path, bootstrap):
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import subprocess, sys\n"
        # a detached process that looks like a crash-test worker and never ends by itself
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)',\n"
        "                  'labkit.faults.runner'], start_new_session=True)\n"
        "import time; time.sleep(1)")]
    nbformat.write(nb, tmp_path / "leaky.ipynb")
    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap}  # reuse the shared broker
    out = subprocess.run([sys.executable, "-m", "pytest", "leaky.ipynb", "--nbval-lax",
                          "-p", "no:cacheprovider", "-q"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "leaky.ipynb left lab processes behind" in out.stdout
    assert "labkit.faults.runner" in out.stdout
