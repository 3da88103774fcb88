"""A worker pool supervised in a thread of its own while an experiment's script drives it
(``labkit.experiments.parts.Workers(script=...)``): the script waits for the app's progress
while the supervision goes on (a killed instance started again, the app's event lines read
from its log, the nemesis's triggers fired), and every instance is stopped when the block
ends, whatever happened.

    with Background(pool) as app:
        app.wait_for(lambda: any(e["event"] == "running" for e in pool.app_events(0)),
                     "the app to run", timeout_s=90)
        run.event("mid-transaction")          # a fault waits for it (Kill: the pool restarts it)
"""
from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

from labkit.faults.pool import WorkerFailed, WorkerPool
from labkit.progress import beat, wait_until


class Background:
    """``pool.run()`` in a thread while the ``with`` block runs; on leaving, every instance
    stopped (``pool.finish``), the thread joined, and what the supervision raised raised
    (unless the block itself raised)."""

    def __init__(self, pool: WorkerPool):
        self.pool = pool
        self.failed: BaseException | None = None  # what the supervision raised
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Background":
        def supervise() -> None:
            try:
                self.pool.run()
            except BaseException as exc:  # raised in the script's thread: wait_for, the end
                self.failed = exc

        # in the caller's context: a notebook's output from the supervision lands in its cell
        self._thread = threading.Thread(target=contextvars.copy_context().run,
                                        args=(supervise,), daemon=True,
                                        name=f"supervising {self.pool.label}")
        self._thread.start()
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.pool.finish()
        self._thread.join()
        if kind is None and self.failed is not None:
            raise self.failed

    @property
    def supervising(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait_for(self, condition: Callable[[], bool], what: str, timeout_s: float) -> None:
        """Until ``condition()`` holds (``what``: for the watchdog and the TimeoutError after
        ``timeout_s``). What the supervision raised is raised at once (an instance that
        failed), and WorkerFailed once every instance has ended without the condition."""
        def ready() -> bool:
            if self.failed is not None:
                raise self.failed
            over = not self.supervising
            if condition():
                return True
            if over:
                raise WorkerFailed(f"{self.pool.label}: every instance ended before {what}; "
                                   f"its last lines:\n{self.pool.log_tail(0)}")
            beat(what)  # waiting on the app is progress, for the watchdog
            return False
        wait_until(ready, what, timeout_s)
