"""Every notebook's exercise, solved with the code of notebooks/solutions/<name>.md, passes
its real check when the notebook runs (the verdict says "Well done"); the notebooks as
shipped stay unsolved ("Not yet"). Breaking a check or a solution makes this fail."""
from __future__ import annotations

import ast
import copy
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import nbformat
import pytest

from tests.notebook_cells import NAMES, NOTEBOOKS, all_output_text, read
from tests.solution_code import solution_codes

SOLVED, UNSOLVED = "✅ Well done", "🔁 Not yet"
SLOW = {"08a_spark_checkpoints_and_sinks": pytest.mark.spark,
        "08b_spark_kafka_in_and_out": pytest.mark.spark}

SLOW["08c_spark_delta_and_replay"] = pytest.mark.spark  # its check crashes a real Spark query


def exercise_indices(nb) -> list[int]:
    found = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and c.source.lstrip().startswith("# EXERCISE")]
    assert found, "expected a code cell starting with '# EXERCISE'"
    return found


def solved(nb, name: str):
    """A copy of ``nb`` with each exercise's solution (the solution page's python blocks, in
    order) inserted right after the exercise's own assignments of the same names (so it
    replaces the placeholders, the check still runs)."""
    nb = copy.deepcopy(nb)
    cells = [nb.cells[i] for i in exercise_indices(nb)]
    answers = solution_codes(name)
    assert len(answers) == len(cells), \
        f"{name}: {len(cells)} exercise cells but {len(answers)} solution blocks"
    for cell, answer in zip(cells, answers):
        names = {t.id for node in ast.parse(answer).body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)}
        assigns = [node for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
                   and {t.id for t in node.targets if isinstance(t, ast.Name)} & names]
        assert assigns, f"{name}: the exercise cell assigns none of {sorted(names)}"
        lines = cell.source.splitlines()
        end = max(node.end_lineno for node in assigns)
        cell.source = "\n".join(lines[:end] + ["# the solution, from notebooks/solutions/",
                                               answer.rstrip()] + lines[end:])
    return nb


@pytest.mark.parametrize("name", NAMES)
def test_the_shipped_notebook_is_unsolved(name):
    nb = read(name)
    exercise_indices(nb)
    text = "".join(all_output_text(c) for c in nb.cells if c.cell_type == "code")
    assert UNSOLVED in text and SOLVED not in text


def test_the_solution_replaces_the_placeholders():
    nb = solved(read("01_at_most_once"), "01_at_most_once")
    source = nb.cells[exercise_indices(nb)[0]].source
    assert source.index("my_lost = None") < source.index("my_lost = 5") < source.index("check_mid_batch_loss(")


# The solved notebooks run two at a time, each in its own process with its own kernel: they
# mostly wait on the broker and on crashed workers' restarts, so two share the 2 cores well
# and the 11 of them take half the wall time. Every notebook is still asserted on its own.
SIDE_BY_SIDE = 2
EXECUTE = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.reads(sys.stdin.read(), as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3",
               resources={"metadata": {"path": sys.argv[1]}}).execute()
sys.stdout.write(nbformat.writes(nb))
"""


def _execute(name: str):
    out = subprocess.run([sys.executable, "-c", EXECUTE, str(NOTEBOOKS)],
                         input=nbformat.writes(solved(read(name), name)),
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise AssertionError(f"{name}: the solved notebook failed to run:\n{out.stderr[-3000:]}")
    return nbformat.reads(out.stdout, as_version=4)


@pytest.fixture(scope="module")
def solved_runs(request):
    """Every solved notebook selected in this session, started at once (two at a time)."""
    names = [item.callspec.params["name"] for item in request.session.items
             if getattr(item, "originalname", None) == "test_the_solved_notebook_passes_its_check"]
    pool = ThreadPoolExecutor(SIDE_BY_SIDE)
    yield {name: pool.submit(_execute, name) for name in names}
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("name", [pytest.param(n, marks=SLOW[n]) if n in SLOW else n for n in NAMES])
def test_the_solved_notebook_passes_its_check(name, solved_runs):
    nb = solved_runs[name].result()
    text = "".join(all_output_text(c) for c in nb.cells if c.cell_type == "code")
    assert SOLVED in text, f"{name}: no '{SOLVED}' verdict:\n{text[-2000:]}"
    assert UNSOLVED not in text
