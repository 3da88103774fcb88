"""A pipeline written in a notebook cell, run by the lab as the worker it crashes.

The crash runner starts each worker as a fresh process (``labkit.faults.runner``) that can
only import module-level functions. ``run_code`` is that function for a learner's code: the
child gets the *text* of the cell that defines the learner's function (its imports
included), executes it, and calls the function with the settings its signature asks for.
So the code on the learner's screen is the code the lab SIGKILLs at its crash points.
"""
from __future__ import annotations

import inspect
import linecache
from collections.abc import Callable


class LearnerCodeError(ValueError):
    """The learner's code cannot be run as a worker; the message says what to change."""


def code_of(function: Callable) -> str:
    """The whole source of the cell (or module) that defines ``function``, imports included.

    IPython keeps each executed cell in ``linecache`` under a file name of its own, so a
    function defined in a notebook cell has a file whose lines are exactly that cell."""
    try:
        filename = inspect.getsourcefile(function)
    except TypeError as exc:
        raise LearnerCodeError(f"{function!r} is not a Python function defined in a cell or a "
                               "file: pass the function itself (def ...)") from exc
    lines = linecache.getlines(filename) if filename else []
    if not lines:
        raise LearnerCodeError(f"the source of {function.__name__} cannot be found: define it "
                               "in a notebook cell or a .py file, then pass it")
    return "".join(lines)


def run_code(code: str, function: str, **settings: object) -> None:
    """Execute ``code`` and call its ``function`` with the ``settings`` it names.

    The worker's settings (bootstrap, topics, group id, transactional id, ...) are passed by
    name, only those the function's parameters ask for; a parameter without a default that
    the lab does not provide is an error that lists what it does provide."""
    namespace: dict[str, object] = {"__name__": "learner_code"}
    exec(compile(code, f"<{function}>", "exec"), namespace)
    target = namespace.get(function)
    if not callable(target):
        raise LearnerCodeError(f"the code defines no function named {function!r}")
    wanted = inspect.signature(target).parameters
    missing = [name for name, p in wanted.items() if name not in settings
               and p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise LearnerCodeError(f"{function}() asks for {missing}, which the lab does not provide; "
                               f"it provides: {', '.join(sorted(settings))}")
    takes_all = any(p.kind is p.VAR_KEYWORD for p in wanted.values())
    target(**{k: v for k, v in settings.items() if takes_all or k in wanted})
