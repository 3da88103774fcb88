"""A pipeline written in a notebook cell, run by the lab as the worker it crashes.

The worker pool (``labkit.faults.pool``) starts each worker as a fresh process
(``labkit.faults.runner``) that can only import module-level functions. ``run_code`` is
that function for a learner's code: the child gets the *text* of the cell that defines
the learner's function (its imports included), executes it, and calls the function with
the settings its signature asks for.
So the code on the learner's screen is the code the lab SIGKILLs at its crash points.
A lesson whose point is a producer's settings shows them as a function of the run's
``bootstrap`` and ``acks``; ``producer_from`` makes the producer the experiment runs from it.
"""
from __future__ import annotations

import ast
import difflib
import hashlib
import inspect
import linecache
from collections.abc import Callable, Iterable

from confluent_kafka import Producer

from labkit.kafka.clientlog import client_config


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


def definitions(code: str) -> ast.Module:
    """The cell without its bare expressions: an exercise cell ends by calling its check
    (``check_my_sink(my_sink, ...)``), which the worker must not run. Imports, functions,
    classes and assignments stay."""
    kept = [node for node in ast.parse(code).body if not isinstance(node, ast.Expr)]
    return ast.Module(body=kept, type_ignores=[])


def load(code: str, function: str) -> Callable:
    """Execute the definitions of ``code`` (a cell's text) and return its function named
    ``function``."""
    return _define(code, function, f"<{function}>")


def check_parameters(target: Callable, provided: set[str]) -> None:
    """A LearnerCodeError, before anything runs, for a parameter without a default that the
    lab does not provide; the message lists what it does provide."""
    if not callable(target):
        raise LearnerCodeError(f"{target!r} is not a function: pass the function itself")
    wanted = inspect.signature(target).parameters
    missing = [name for name, p in wanted.items() if name not in provided
               and p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise LearnerCodeError(f"{target.__name__}() asks for {missing}, which the lab does not "
                               f"provide; it provides: {', '.join(sorted(provided))}")


def call(target: Callable, **settings: object) -> object:
    """Call ``target`` with the ``settings`` it names, only those its parameters ask for
    (``check_parameters`` first)."""
    check_parameters(target, set(settings))
    wanted = inspect.signature(target).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in wanted.values())
    return target(**{k: v for k, v in settings.items() if takes_all or k in wanted})


def run_code(code: str, function: str, **settings: object) -> None:
    """Execute ``code`` and call its ``function`` with the worker's settings (bootstrap,
    topics, group id, transactional id, ...) it names."""
    call(load(code, function), **settings)


def edited(function: Callable, name: str, changes: dict[str, str]) -> Callable:
    """A copy of ``function`` named ``name``, with each text of ``changes`` (each found exactly
    once in its cell) replaced: a lesson's "what if this line were different", run as the
    worker like any cell. The copy's text is registered in ``linecache`` as IPython does for
    a cell, so ``code_of`` (and ``diff``) find it."""
    code = code_of(function)
    for old, new in changes.items():
        if code.count(old) != 1:
            raise LearnerCodeError(f"{old!r} occurs {code.count(old)} times in the cell of "
                                   f"{function.__name__}, not once")
        code = code.replace(old, new)
    code = code.replace(f"def {function.__name__}(", f"def {name}(", 1)
    return from_text(code, name, f"<edited {name}>")


def from_text(code: str, function: str, filename: str) -> Callable:
    """``function`` defined by ``code`` as a notebook cell defines it: the text is kept in
    ``linecache`` under ``filename`` (IPython does the same for each cell), so ``code_of``
    finds the whole cell; only its definitions run (an exercise cell ends by calling its check)."""
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    return _define(code, function, filename)


def _define(code: str, function: str, filename: str) -> Callable:
    namespace: dict[str, object] = {"__name__": "learner_code"}
    exec(compile(definitions(code), filename, "exec"), namespace)
    target = namespace.get(function)
    if not callable(target):
        raise LearnerCodeError(f"the code defines no function named {function!r}")
    return target


def definition(function: Callable) -> ast.FunctionDef | None:
    """The ``def`` of ``function`` in its cell: the last one of its name (a cell may define it
    twice, e.g. the code shown and a fix below it: the last one runs); None when its source
    cannot be read."""
    try:
        tree = ast.parse(code_of(function))
    except (LearnerCodeError, SyntaxError):
        return None
    found = [n for n in ast.walk(tree)
             if isinstance(n, ast.FunctionDef) and n.name == function.__name__]
    return found[-1] if found else None


def crash_points_in(function: Callable, known: Iterable[str] | None = None) -> list[str]:
    """The ``crash_point("...")`` calls of ``function``'s own definition (those of ``known``,
    if given), in the order they appear in it: an exercise's check refuses, before running
    it, a loop that lost the points it is judged at."""
    found = definition(function)
    calls = sorted((node.lineno, node.col_offset, node.args[0].value)
                   for node in ast.walk(found or ast.Module(body=[], type_ignores=[]))
                   if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "crash_point"
                   and node.args and isinstance(node.args[0], ast.Constant))
    names = dict.fromkeys(name for _, _, name in calls)
    return [n for n in names if known is None or n in set(known)]


def fingerprint(function: Callable) -> str | None:
    """A hash of ``function``'s parameters and body as parsed (comments, blank lines and its
    name do not count); None when its source cannot be read."""
    found = definition(function)
    if found is None:
        return None
    shape = ast.dump(ast.Module(body=found.body, type_ignores=[])) + ast.dump(found.args)
    return hashlib.sha256(shape.encode()).hexdigest()[:16]


def diff(before: Callable, after: Callable, cell: bool = False) -> str:
    """The lines of ``after``'s function that differ from ``before``'s (its name aside), with one
    line around each change, as a unified diff. ``cell``: of their whole cells (an import or
    a helper function changed too)."""
    source = code_of if cell else inspect.getsource
    old = source(before).splitlines()
    new = source(after).replace(f"def {after.__name__}(", f"def {before.__name__}(",
                                1).splitlines()
    return "\n".join(difflib.unified_diff(old, new, before.__name__, after.__name__, n=1,
                                          lineterm=""))


def producer_from(settings: Callable[..., dict], bootstrap: str, acks: str,
                  **watching: object) -> Producer:
    """The producer ``settings`` (the learner's function or a reference one) describes for
    ``bootstrap`` and ``acks``, plus what the lab adds to watch it (``watching``: its log
    level, a statistics callback), which must not be settings of the learner's."""
    config = call(settings, bootstrap=bootstrap, acks=acks)
    if not isinstance(config, dict):
        raise ValueError(f"{getattr(settings, '__name__', settings)}() must return the "
                         f"producer's settings as a dict, not {type(config).__name__}")
    taken = sorted(set(config) & set(watching))
    if taken:
        raise ValueError(f"{', '.join(taken)}: the lab sets these to watch the producer; "
                         "leave them out of the settings")
    return Producer(client_config({**config, **watching}))
