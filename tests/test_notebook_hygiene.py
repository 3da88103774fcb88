"""The nbval run fails a notebook that leaves lab processes behind (see conftest.py); no stored
output names a directory of the machine that ran it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.pipelines import contract
from tests.notebook_cells import NAMES, all_output_text, read

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


# A directory of the machine that ran the notebook, in a stored output: a home, a temp dir,
# a checkout (/work/...), a virtualenv or the jar cache. The site and every learner see them.
MACHINE_PATH = re.compile(r"(/tmp/|/home/|/root/|/Users/|/work/|\.venv/|/\.cache/)")
# Stored before the torture progress line named files instead of paths (contract.shown);
# strict: once its owner runs it again, this entry must go.
STALE: dict[str, str] = {}


def machine_paths(name: str) -> list[tuple[int, str]]:
    found = []
    for i, cell in enumerate(read(name).cells):
        if cell.cell_type == "code":
            text = all_output_text(cell)
            found += [(i, text[text.rfind("\n", 0, m.start()) + 1:].split("\n")[0][:120])
                      for m in MACHINE_PATH.finditer(text)]
    return found


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    strict=True, reason=STALE[n])) if n in STALE else n for n in NAMES])
def test_no_stored_output_names_a_directory_of_this_machine(name):
    assert machine_paths(name) == []


def test_the_path_check_finds_what_it_is_for():
    assert MACHINE_PATH.search("✓ torture: /work/main/.venv/bin/python /tmp/own-pipeline-1/a.py")
    assert not MACHINE_PATH.search("✓ torture: python -m labkit.torture.apps function a.py a")
    assert contract.shown(["/usr/bin/python3", "/tmp/x/my_app.py", "-cp", "/a/b/*:/c/d.jar"]) \
        == "python3 my_app.py -cp '*:d.jar'"
