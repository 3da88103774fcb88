"""The code block of a notebook's solution page, run: tests check the documented answer."""
from __future__ import annotations

import re
from pathlib import Path

SOLUTIONS = Path(__file__).parents[1] / "notebooks" / "solutions"


def solution_scope(name: str) -> dict:
    """Run the first ```python block of notebooks/solutions/<name>.md; return its names."""
    text = (SOLUTIONS / f"{name}.md").read_text()
    scope: dict = {}
    exec(re.search(r"```python\n(.*?)```", text, re.S).group(1), scope)
    return scope
