"""One progress line for long steps, the same in a terminal and in a notebook."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.errors import LiveError

from labkit import settings

_console = Console(stderr=True)
# In a kernel without a live front end (nbconvert, nbval) rich's spinner widget cannot
# animate: its frames pile up as cell outputs (nbval ignores clear_output). There the line
# goes to stderr as plain text instead.
_plain_console = Console(stderr=True, force_jupyter=False, force_terminal=False)


MODES = ("live", "static")


def live_frontend() -> bool:
    """True when a front end renders live output (JupyterLab started this kernel).

    Executed notebooks (nbval, nbconvert) have none. A kernel that JupyterLab/Jupyter Server
    started has ``JPY_SESSION_NAME`` in its environment; ``LABKIT_WIDGETS=live|static``
    overrides the guess (e.g. for VS Code).
    """
    forced = settings.current().widgets
    if forced:
        if forced not in MODES:
            raise ValueError(f"LABKIT_WIDGETS={forced!r}: use 'live' or 'static'")
        return forced == "live"
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel") and "JPY_SESSION_NAME" in os.environ


def _console_now() -> Console:
    if "ipykernel" in sys.modules:
        if not live_frontend():
            return _plain_console
    return _console


@contextmanager
def status(message: str) -> Iterator[Callable[[str], None]]:
    """Show a spinner with ``message``; the yielded function changes the text."""
    console = _console_now()
    try:
        live = console.status(message)
        live.start()
    except LiveError:  # another step shows its line already (experiments run side by side)
        yield lambda text: None
        return
    try:
        yield lambda text: live.update(text)
    finally:
        live.stop()
    console.print(f"[green]✓[/green] {message}")
