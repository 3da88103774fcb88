"""Live or static? And the background loop that keeps a live view fresh.

Live widgets need a front end that renders ipywidgets (JupyterLab). Executed notebooks
(nbval, nbconvert) have none, so there the views show a static picture instead. A kernel
that JupyterLab/Jupyter Server started has ``JPY_SESSION_NAME`` in its environment;
``LABKIT_WIDGETS=live|static`` overrides the guess (e.g. for VS Code).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# Where output goes is decided in progress (a lower layer that also needs it).
from labkit.progress import MODES, live_frontend  # noqa: F401  (re-exported)


@dataclass
class LoopStats:
    """How often the loop refreshed and what it cost (CPU of the loop's own thread)."""

    refreshes: int = 0
    errors: int = 0
    started: float = 0.0
    stopped: float = 0.0
    cpu_s: float = 0.0
    last_error: str | None = None

    @property
    def seconds(self) -> float:
        if not self.started:
            return 0.0
        return (self.stopped or time.monotonic()) - self.started

    @property
    def rate_hz(self) -> float:
        return self.refreshes / self.seconds if self.seconds else 0.0

    @property
    def cpu_share(self) -> float:
        """CPU seconds per wall second: 0.1 is 10% of one core."""
        return self.cpu_s / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return {"refreshes": self.refreshes, "errors": self.errors, "seconds": round(self.seconds, 2),
                "rate_hz": round(self.rate_hz, 2), "cpu_share": round(self.cpu_share, 4),
                "last_error": self.last_error}


class Loop:
    """Calls ``tick`` every ``interval_s`` on a daemon thread until stopped or ``until()``
    turns true; then calls ``on_end`` once (on the loop's thread)."""

    def __init__(self, tick: Callable[[], None], interval_s: float,
                 on_error: Callable[[Exception], None],
                 until: Callable[[], bool] | None = None,
                 on_end: Callable[[], None] | None = None):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, not {interval_s}")
        self.tick, self.interval_s, self.on_error = tick, interval_s, on_error
        self.until, self.on_end = until, on_end
        self.stats = LoopStats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="labkit-dashboard", daemon=True)

    def start(self) -> None:
        self.stats.started = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began, cpu = time.monotonic(), time.thread_time()
            try:
                self.tick()
                self.stats.refreshes += 1
            except Exception as exc:  # a broker restarting mid-lesson: show it, keep going
                self.stats.errors += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                self.on_error(exc)
            self.stats.cpu_s += time.thread_time() - cpu
            if self.until is not None and self.until():
                break
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))
        self.stats.stopped = time.monotonic()
        if self.on_end is not None and not self._stop.is_set():
            self.on_end()

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        if not self.stats.stopped:
            self.stats.stopped = time.monotonic()
