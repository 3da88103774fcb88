"""The worker's side of a supervised run: what each child process of
``labkit.faults.pool.WorkerPool`` executes.

The worker is a module-level function called with JSON-able keyword arguments in a fresh
``python -m labkit.faults.runner`` process, or, in a judged run, forked from a server that
has this module imported (``run_forked``). The pool supervises them (restarted when killed,
the nemesis's process faults: ``labkit.faults.process_faults``) as an experiment's clients
(``labkit.experiments.parts.Workers``); here the worker runs under its armed crash point,
what it raised goes to the run's history, and it ends when its supervisor has died.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
import traceback

from labkit.checking import history
from labkit.faults import crashpoints
from labkit.faults.pool import WorkerFailed

# WorkerFailed is imported from here by the exercises (labkit.exercises.loops, idempotence)
__all__ = ["WorkerFailed", "run_forked", "error_class"]


def _main(target: str) -> None:
    """Child side (``python -m``): import the worker, read its kwargs from stdin, run it."""
    _end_with_supervisor()
    _run(target, json.loads(sys.stdin.read()))


def run_forked(argument: dict) -> None:
    """Child side, forked from a server that has this module imported
    (``labkit.forkserver``): ``{"target": ..., "kwargs": ...}``."""
    _end_with_supervisor()
    _run(argument["target"], argument["kwargs"])


def _run(target: str, kwargs: dict) -> None:
    module, _, func = target.partition(":")
    worker = getattr(importlib.import_module(module), func)
    # then e.g. fire-and-forget writes reach the log (labkit.pipelines.common.DeliveryTracker.drain)
    try:
        crashpoints.run_as_worker(lambda: worker(**kwargs))
    except Exception as exc:  # what it raised, with its class, for a judge of its reactions
        history.record("raised", **error_class(exc),
                       where="".join(traceback.format_exception(exc)[-4:])[-1500:])
        raise


def _end_with_supervisor(every_s: float = 0.5) -> None:
    """A worker never outlives the process that supervises it: once re-parented (that
    process died), it ends itself. Workers started from a supervisor's thread get no death
    signal (``labkit.proc.die_with_owner``), so a supervisor SIGKILLed without its clean-up
    (a judged run whose notebook kernel ended) left them running: three in a fresh clone's
    suite, after notebook 10."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)  # nobody is left to read it: no clean-up, as a SIGKILL would

    threading.Thread(target=watch, name="labkit-supervisor-watch", daemon=True).start()


def error_class(exc: BaseException) -> dict:
    """What a worker raised: its type and text, and for a Kafka error (a KafkaException's
    KafkaError) its code and class: fatal, abortable (txn_requires_abort) or retriable."""
    found: dict = {"error": type(exc).__name__, "text": str(exc)[:400]}
    error = exc.args[0] if exc.args else None
    if all(hasattr(error, m) for m in ("name", "fatal", "retriable", "txn_requires_abort")):
        found.update(code=error.name(), fatal=error.fatal(), retriable=error.retriable(),
                     abortable=error.txn_requires_abort(), text=error.str()[:400])
    return found


if __name__ == "__main__":
    _main(sys.argv[1])
