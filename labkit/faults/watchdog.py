"""A watchdog for an experiment: no progress for ``stall_s`` seconds ends it with an error
that says where it stood, instead of a silent spin.

    watchdog = Watchdog("coordinator-failover", stall_s=120)
    watchdog.progress("batch 1: committed", waiting_for="batch 2's commit")  # from its steps
    result = watchdog.run(lambda: loop(...), on_stall=lab.kill)

The experiment's own code (the learner's loop and the faults its hooks inject) runs in a
thread of its own while the caller's thread watches the clock. A client call blocked inside
librdkafka cannot be interrupted from Python (and some ignore their own timeout: librdkafka
issues 5511 and 5456), so on a stall the watchdog stops the experiment's processes
(``on_stall``), leaves the blocked thread behind (a daemon thread: nothing waits for it) and
raises ExperimentStalled naming the last step and what the experiment was waiting for.
"""
from __future__ import annotations

import contextvars
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

from labkit import proc, progress

T = TypeVar("T")
POLL_S = 0.2


class ExperimentStalled(RuntimeError):
    """An experiment made no progress for its ``stall_s``; its processes were stopped."""

    def __init__(self, experiment: str, stall_s: float, last_step: str, last_step_s: float,
                 waiting_for: str, stopped: str, stood_in: str = ""):
        self.experiment, self.stall_s = experiment, stall_s
        self.last_step, self.last_step_s, self.waiting_for = last_step, last_step_s, waiting_for
        self.stood_in = stood_in  # where the experiment's own thread was, innermost last
        super().__init__(
            f"{experiment} made no progress for {stall_s:.0f} s, so it was stopped "
            f"({stopped}). Last step, at {last_step_s:.1f} s: {last_step}. It was waiting for "
            f"{waiting_for}. One known cause: a client call that blocks past its own timeout "
            "after a broker left the cluster (librdkafka issues 5511 and 5456). Run the "
            "experiment again; if it stalls at the same step, report it with this message."
            + (f" Its code stood in:\n{stood_in}" if stood_in else ""))


class Watchdog:
    """The progress clock of one experiment run (thread-safe: steps come from its thread)."""

    def __init__(self, experiment: str, stall_s: float,
                 clock: Callable[[], float] = time.monotonic):
        if stall_s <= 0:
            raise ValueError(f"stall_s must be a positive number of seconds, not {stall_s!r}")
        self.experiment, self.stall_s, self._clock = experiment, stall_s, clock
        self._started = clock()
        self._lock = threading.Lock()
        self._last = (self._started, "started", "its first step")

    def progress(self, step: str | None, waiting_for: str | None = "its next step") -> None:
        """The experiment did something (``step``; None: progress with no step of its own,
        the last step stays the one named) and now waits for ``waiting_for`` (None: what it
        waited for before)."""
        with self._lock:
            self._last = (self._clock(), step or self._last[1], waiting_for or self._last[2])

    def stalled_for(self) -> float:
        """Seconds since the last progress."""
        with self._lock:
            return self._clock() - self._last[0]

    def run(self, body: Callable[[], T], on_stall: Callable[[], None],
            stopped: str = "its processes were stopped") -> T:
        """``body()`` in a thread of its own; its result, or its exception re-raised here.
        No ``progress`` for ``stall_s``: ``on_stall()`` runs, then ExperimentStalled."""
        outcome: dict[str, object] = {}

        def target() -> None:
            try:
                outcome["result"] = body()
            except BaseException as exc:  # handed to the watching thread, raised there
                outcome["error"] = exc

        # In the caller's context: a notebook's output from the body lands in the running cell.
        context = contextvars.copy_context()
        worker = threading.Thread(target=context.run, args=(target,),
                                  name=f"{self.experiment}-body", daemon=True)
        with self._lock:  # the clock starts now; the last step and its wait stay as they were
            self._last = (self._clock(), *self._last[1:])
        worker.start()
        while True:
            worker.join(POLL_S)
            if not worker.is_alive():
                if "error" in outcome:
                    raise outcome["error"]  # type: ignore[misc]
                return outcome["result"]  # type: ignore[return-value]
            if self.stalled_for() > self.stall_s:
                with self._lock:
                    at, step, waiting_for = self._last
                stood_in = _stack_of(worker)  # before on_stall: the call it blocked in
                on_stall()
                raise ExperimentStalled(self.experiment, self.stall_s, step,
                                        at - self._started, waiting_for, stopped, stood_in)


def _stack_of(thread: threading.Thread, frames: int = 4) -> str:
    """The innermost ``frames`` lines of ``thread``'s Python stack (a client call blocked in
    librdkafka shows as the Python line that made it)."""
    frame = sys._current_frames().get(thread.ident)
    if frame is None:
        return ""
    return "".join(traceback.format_stack(frame)[-frames:]).rstrip()


def watched(experiment: str, stall_s: float, body: Callable[[], T],
            stop: Callable[[], None] | None = None) -> T:
    """``body()`` under a watchdog fed by the experiment's steps (``labkit.progress.step``
    and ``beat``, from whichever thread). No progress for ``stall_s``: ``stop()`` runs, every
    process started since the call is SIGKILLed (workers, brokers, Spark drivers), and
    ExperimentStalled names the last step. A Ctrl-C while it waits stops them the same way."""
    watchdog = Watchdog(experiment, stall_s)
    before = {p.pid for p in proc.descendants(os.getpid())}

    def stop_everything() -> None:
        listening.stop()  # first: nothing it runs may start a process again
        if stop is not None:
            stop()
        proc.kill([p for p in proc.descendants(os.getpid()) if p.pid not in before])

    with progress.listening(watchdog.progress) as listening:
        try:
            return watchdog.run(body, on_stall=stop_everything,
                                stopped="every process it had started was killed")
        except KeyboardInterrupt:
            stop_everything()
            raise
