"""The code block of a notebook's solution page, run: tests check the documented answer."""
from __future__ import annotations

import re
from pathlib import Path

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
