"""The code block of a notebook's solution page, run: tests check the documented answer."""
from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import nbformat

SOLUTIONS = Path(__file__).parents[1] / "notebooks" / "solutions"


def solution_codes(name: str) -> list[str]:
    """Every ```python block of notebooks/solutions/<name>.md, one per exercise, in order."""
    text = (SOLUTIONS / f"{name}.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def solution_code(name: str) -> str:
    """The first ```python block of notebooks/solutions/<name>.md."""
    return solution_codes(name)[0]


def solution_scope(name: str) -> dict:
    """Run the solution's code block; return its names."""
    scope: dict = {}
    exec(solution_code(name), scope)
    return scope


SOLVED, UNSOLVED = "✅ Well done", "🔁 Not yet"


def exercise_indices(nb) -> list[int]:
    """The indices of a notebook's exercise cells (code cells starting with '# EXERCISE')."""
    return [i for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and c.source.lstrip().startswith("# EXERCISE")]


def checks_in_place(nb) -> bool:
    """Whether each exercise cell prints its own check (its stored output says "Not yet").
    Only then can the notebook run once, solved, with every other stored output compared:
    where the check comes cells later (10), the cells between show the unsolved run."""
    return all(UNSOLVED in "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "")
                                   for o in nb.cells[i].get("outputs", []))
               for i in exercise_indices(nb))


def _bound_names(node: ast.stmt) -> set[str]:
    """The names a top-level assignment or def binds (an exercise's answer is either)."""
    if isinstance(node, ast.FunctionDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def solved(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """A copy of ``nb`` with each exercise's solution (the solution page's python blocks, in
    order) inserted right after the exercise's own assignments (or defs) of the same names
    (so it replaces the placeholders, the check still runs)."""
    nb = copy.deepcopy(nb)
    cells = [nb.cells[i] for i in exercise_indices(nb)]
    assert cells, f"{name}: expected a code cell starting with '# EXERCISE'"
    answers = solution_codes(name)
    assert len(answers) == len(cells), \
        f"{name}: {len(cells)} exercise cells but {len(answers)} solution blocks"
    for cell, answer in zip(cells, answers):
        names = set().union(*map(_bound_names, ast.parse(answer).body))
        assigns = [node for node in ast.parse(cell.source).body if _bound_names(node) & names]
        assert assigns, f"{name}: the exercise cell assigns none of {sorted(names)}"
        lines = cell.source.splitlines()
        end = max(node.end_lineno for node in assigns)
        cell.source = "\n".join(lines[:end] + ["# the solution, from notebooks/solutions/",
                                               answer.rstrip()] + lines[end:])
    return nb
