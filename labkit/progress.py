"""One progress line for long steps, the same in a terminal and in a notebook."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console

_console = Console(stderr=True)


@contextmanager
def status(message: str) -> Iterator[Callable[[str], None]]:
    """Show a spinner with ``message``; the yielded function changes the text."""
    with _console.status(message) as live:
        yield lambda text: live.update(text)
    _console.print(f"[green]✓[/green] {message}")
