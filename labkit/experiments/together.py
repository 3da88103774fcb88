"""Experiments run side by side: a lesson's comparison (two guarantees) in about the time of
one, when each run mostly waits on processes of its own (a Flink job's JVM starting: one
core's work each), or one started in the background while the learner reads on.

    eo, alo = experiments.run_together(
        dict(name="flink-crash", guarantee="exactly_once", pipeline=fee_job),
        dict(name="flink-crash", guarantee="at_least_once", pipeline=fee_job))
    later = experiments.start("flink-timeout-trap", pipeline=fee_job)   # runs meanwhile
    trap = later.result()                                                # its record

Each run is ``experiments.run(name, **options)`` in a thread of its own (in the caller's
context, so a notebook shows what it prints in the cell that started it), with its own
names, topics, folder and watchdog, cleaning up after itself as any run does.
"""
from __future__ import annotations

import contextvars
import threading
from typing import Any

from labkit.checking.record import RunRecord
from labkit.experiments.registry import run


class Running:
    """An experiment running in a thread of its own; ``result()`` waits for its record (or
    raises what the run raised)."""

    def __init__(self, name: str, options: dict[str, Any]):
        self.name = name
        self._record: RunRecord | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=contextvars.copy_context().run,
                                         args=(self._run, options), daemon=True,
                                         name=f"experiment-{name}")
        self._thread.start()

    def _run(self, options: dict[str, Any]) -> None:
        try:
            self._record = run(self.name, **options)
        except BaseException as exc:  # raised by result(), in the caller's thread
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> RunRecord:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._record is not None
        return self._record


def start(name: str, **options: Any) -> Running:
    """Experiment ``name`` started now in the background (``run``'s arguments)."""
    return Running(name, options)


def run_together(*runs: dict[str, Any]) -> list[RunRecord]:
    """Each of ``runs`` (``run``'s arguments, the experiment's ``name`` among them) at once;
    their records, in order. If one fails, the first error is raised once every run has
    ended, and what the others kept is deleted (of no use without the failed one)."""
    if not runs or any("name" not in r for r in runs):
        raise ValueError("run_together takes one dict per run, each with the experiment's "
                         "name: dict(name='flink-crash', guarantee='exactly_once', ...)")
    running = [start(**r) for r in runs]
    records, errors = [], []
    for one in running:
        try:
            records.append(one.result())
        except BaseException as exc:
            errors.append(exc)
    if errors:
        for record in records:
            record.cleanup()
        raise errors[0]
    return records
