"""Every notebook's exercise, solved with the code of notebooks/solutions/<name>.md, passes
its real check when the notebook runs: nbval runs each notebook once, solved (conftest.py's
SolvedNotebook), and fails unless every exercise cell says "Well done". The notebooks as
shipped stay unsolved ("Not yet"), checked here from their stored outputs."""
from __future__ import annotations

import pytest

from tests.notebook_cells import NAMES, all_output_text, read
from tests.solution_code import SOLVED, UNSOLVED, exercise_indices, solved


@pytest.mark.parametrize("name", NAMES)
def test_the_shipped_notebook_is_unsolved(name):
    nb = read(name)
    assert exercise_indices(nb), f"{name}: no code cell starts with '# EXERCISE'"
    text = "".join(all_output_text(c) for c in nb.cells if c.cell_type == "code")
    assert UNSOLVED in text and SOLVED not in text


def test_the_solution_replaces_the_placeholders():
    nb = solved(read("01_at_most_once"), "01_at_most_once")
    source = nb.cells[exercise_indices(nb)[0]].source
    assert source.index("my_lost = None") < source.index("my_lost = 5") < source.index("check_mid_batch_loss(")
