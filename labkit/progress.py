"""One progress line for long steps, the same in a terminal and in a notebook."""
from __future__ import annotations

import contextvars
import os
import sys
import threading
import time
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
        yield lambda text: beat()
        return

    def update(text: str) -> None:
        live.update(text)
        beat()  # a changed progress line is progress

    try:
        yield update
    finally:
        live.stop()
    console.print(f"[green]✓[/green] {message}")


# --------------------------------------------------------------------------- steps
# An experiment's steps, as they happen: the watchdog (labkit.faults.watchdog) counts them as
# progress and the CLI prints the named ones. Listeners are process-wide, not per thread,
# because an experiment's code runs in a thread of its own (the watchdog's) and its hooks in
# others (a live view's poller).
_listeners_lock = threading.Lock()


class Stopped(RuntimeError):
    """The experiment was stopped from outside (its watchdog): it must not go on."""


class Listening:
    """One listener's registration; ``stop()`` makes every ``check()`` meanwhile raise Stopped."""

    def __init__(self, listener: Callable[[str | None, str | None], None]) -> None:
        self.listener = listener
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()


_listening: list[Listening] = []
# The stop of the run whose code this is. The watchdog's body thread copies its caller's
# context, so a body left blocked after its run was stopped still sees the stop once the run
# has ended and its listener is gone: a late restart raises instead of starting a process.
_run_stopped: contextvars.ContextVar[threading.Event | None] = \
    contextvars.ContextVar("labkit_run_stopped", default=None)


def _tell(what: str | None, waiting_for: str | None) -> None:
    with _listeners_lock:
        handles = list(_listening)
    for handle in handles:
        handle.listener(what, waiting_for)


def step(what: str, waiting_for: str | None = "its next step") -> None:
    """An experiment did ``what`` (a line of its timeline) and now waits for ``waiting_for``
    (None: for what it waited for before)."""
    _tell(what, waiting_for)


def beat(waiting_for: str | None = None) -> None:
    """Progress with no line of its own (a worker logged a batch, a micro-batch ended);
    ``waiting_for`` None keeps what the last step said it waits for."""
    _tell(None, waiting_for)


@contextmanager
def listening(listener: Callable[[str | None, str | None], None]) -> Iterator[Listening]:
    """Hand every ``step`` and ``beat`` to ``listener(what or None, waiting_for)`` meanwhile."""
    handle = Listening(listener)
    with _listeners_lock:
        _listening.append(handle)
    token = _run_stopped.set(handle.stopped)
    try:
        yield handle
    finally:
        _run_stopped.reset(token)
        with _listeners_lock:
            _listening.remove(handle)


def stopped() -> bool:
    """Was the experiment whose code this is (or any running now) stopped by its watchdog?"""
    own = _run_stopped.get()
    with _listeners_lock:
        any_stopped = any(h.stopped.is_set() for h in _listening)
    return any_stopped or (own is not None and own.is_set())


def check() -> None:
    """Raise Stopped if the experiment running now was stopped: called before anything that
    would start a process again (a restart after a kill), so a stopped run stays stopped."""
    if stopped():
        raise Stopped("the experiment was stopped by its watchdog")


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    """Poll ``condition`` every 0.1 s; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.1)
