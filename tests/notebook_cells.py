"""Reading the notebooks as CI sees them: their cells, stored outputs and nbval markers."""
from __future__ import annotations

import ast
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).parents[1] / "notebooks"
# "_"-prefixed notebooks are a test's temporary copies, not lessons
NAMES = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb") if not p.stem.startswith("_"))
# nbval does not compare a cell that has one of these in its source or tags
UNCOMPARED_MARKS = ("NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP", "NBVAL_CHECK_OUTPUT_NEVER")
UNCOMPARED_TAGS = ("nbval-ignore-output", "nbval-skip")


def read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def compared_text(cell) -> str:
    """What nbval compares of a code cell's stored outputs: stdout and text/plain (stderr is
    left out by conftest.py, images are never compared)."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and out.name == "stdout":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def all_output_text(cell) -> str:
    """Every stored output of a cell as text, stderr included."""
    parts = [compared_text(cell)]
    parts += [o.text for o in cell.get("outputs", []) if o.output_type == "stream" and o.name != "stdout"]
    return "".join(parts)


def is_compared(cell) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    return (not any(m in cell.source for m in UNCOMPARED_MARKS)
            and not any(t in tags for t in UNCOMPARED_TAGS))


def as_cell(source: str, function: str):
    """``function`` defined by ``source`` as a notebook cell defines it (the lab sends the
    whole cell; only its definitions run here, as in the worker)."""
    import uuid

    from labkit.pipelines.learner import from_text

    return from_text(source, function, f"<cell-{uuid.uuid4().hex[:8]}>")


def edited(source: str, old: str, new: str) -> str:
    assert old in source, f"the notebook's code no longer contains {old!r}"
    return source.replace(old, new)


def exercise_function(notebook: str, name: str, solved_: bool = False, edits: dict | None = None):
    """The function ``name`` of ``notebook``'s exercise cell as the learner runs it: shipped,
    solved with notebooks/solutions (the solution's def after the shipped one, as the solved
    notebook runs), or with ``edits`` to the shipped text (each found once)."""
    from tests.solution_code import solved

    nb = solved(read(notebook), notebook) if solved_ else read(notebook)
    (source,) = [c.source for c in nb.cells if c.cell_type == "code"
                 and c.source.lstrip().startswith("# EXERCISE") and f"def {name}(" in c.source]
    for old, new in (edits or {}).items():
        source = edited(source, old, new)
    return as_cell(source, name)


def shown_function(notebook: str, name: str):
    """The function ``name`` as the notebook shows it before its exercise: only its ``def``
    (what the checks compare a learner's copy with), not the rest of its cell."""
    (source,) = [c.source for c in read(notebook).cells
                 if c.cell_type == "code" and f"def {name}(" in c.source
                 and not c.source.lstrip().startswith("# EXERCISE")]
    (found,) = [node for node in ast.parse(source).body
                if isinstance(node, ast.FunctionDef) and node.name == name]
    return as_cell(ast.get_source_segment(source, found), name)
