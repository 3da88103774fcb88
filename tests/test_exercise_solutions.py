"""Every notebook's exercise, solved with the code of notebooks/solutions/<name>.md, passes
its real check when the notebook runs: nbval runs each notebook once, solved (conftest.py's
SolvedNotebook), and fails unless every exercise cell says "Well done". The notebooks as
shipped stay unsolved ("Not yet"), checked here from their stored outputs."""
from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from tests.notebook_cells import NAMES, NOTEBOOKS, all_output_text, read
from tests.solution_code import SOLVED, UNSOLVED, checks_in_place, exercise_indices, solved

# Their check comes cells after the exercise, so nbval runs them as shipped (the cells in
# between show the unsolved run): their solution runs here, in a notebook of its own.
CHECKED_LATER = [n for n in NAMES if not checks_in_place(read(n))]
# what its verdict must also say (the capstone's: every run at the named points, the wire and
# the commit was exact, and then production's faults, on both group protocols, found it
# exact too)
VERDICT_SAYS = {"10_capstone": ("all 5 runs at the named points, the wire and the commit "
                                "exactly-once",
                                "production's faults on the classic protocol and the "
                                "consumer protocol: no payment lost")}
EXECUTE = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.reads(sys.stdin.read(), as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3",
               resources={"metadata": {"path": sys.argv[1]}}).execute()
sys.stdout.write(nbformat.writes(nb))
"""


@pytest.mark.parametrize("name", NAMES)
def test_the_shipped_notebook_is_unsolved(name):
    nb = read(name)
    assert exercise_indices(nb), f"{name}: no code cell starts with '# EXERCISE'"
    text = "".join(all_output_text(c) for c in nb.cells if c.cell_type == "code")
    assert UNSOLVED in text and SOLVED not in text


def test_the_solution_replaces_the_placeholders():
    nb = solved(read("01_at_most_once"), "01_at_most_once")
    source = nb.cells[exercise_indices(nb)[0]].source
    shipped = source.index("def my_loop(")  # the copy to edit, then the solution's def
    assert shipped < source.index("def my_loop(", shipped + 1) < source.index("check_loses_nothing(")
    nb = solved(read("04_transactions"), "04_transactions")  # a prediction: values replaced
    source = nb.cells[exercise_indices(nb)[-1]].source
    assert source.index("my_last_offset = None") < source.index("my_last_offset = 7") \
        < source.index("check_transactions(")


def test_only_the_capstone_checks_in_a_later_cell():  # the others print their check
    """Every other notebook runs once in CI; a new one checked later costs a second run."""
    assert CHECKED_LATER == ["10_capstone"]


@pytest.mark.parametrize("name", CHECKED_LATER)
def test_the_solved_notebook_passes_its_check(name):
    out = subprocess.run([sys.executable, "-c", EXECUTE, str(NOTEBOOKS)],
                         input=nbformat.writes(solved(read(name), name)),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"{name}: the solved notebook failed to run:\n{out.stderr[-3000:]}"
    nb = nbformat.reads(out.stdout, as_version=4)
    text = "".join(all_output_text(c) for c in nb.cells if c.cell_type == "code")
    assert SOLVED in text, f"{name}: no '{SOLVED}' verdict:\n{text[-2000:]}"
    for phrase in VERDICT_SAYS[name]:
        assert phrase in text, text[-2000:]
    assert UNSOLVED not in text
