"""Automatic checks for the notebooks' exercises: a friendly verdict, never a stack trace.

One module per notebook (``labkit.exercises.tour`` for 00, ...); this one holds the verdict.

Each check returns a Verdict whose text is short and stable (nbval compares it). A check
that needs the cluster measures the answer against it; it never trusts the learner's claim.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    passed: bool
    message: str

    def __str__(self) -> str:
        return f"{'✅ Well done' if self.passed else '🔁 Not yet'}: {self.message}"

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython shows str(), not the dataclass
        printer.text(str(self))


def check(passed: bool, success: str, hint: str) -> Verdict:
    return Verdict(passed, success if passed else hint)


def unanswered(answer: object) -> bool:
    return answer is None or answer is ...


def prediction_gaps(prediction: object, points: tuple[str, ...], fill_in: str) -> Verdict | None:
    """A "Not yet" for a prediction dict (crash point -> answer) that is not a dict, names
    unknown points or leaves some unanswered; None when it is complete. ``fill_in`` says
    what to write, e.g. "True (the counts drift) or False (they stay right)"."""
    if not isinstance(prediction, dict):
        return check(False, "", f"my_prediction must be a dict: crash point -> {fill_in}.")
    unknown = sorted(set(prediction) - set(points))
    if unknown:
        return check(False, "", f"{unknown} are not crash points of this exercise; use "
                                f"{', '.join(points)}.")
    missing = [p for p in points if unanswered(prediction.get(p))]
    if missing:
        return check(False, "", f"fill in {fill_in} for: {', '.join(missing)}; then run this "
                                "cell again.")
    return None


def not_changed(function: object, name: str, shown: Callable | str | None = None,
                unchanged: str = "", not_a_function: str = "") -> Verdict | None:
    """A "Not yet" before anything runs for a code exercise: ``function`` is not a function
    (``not_a_function`` says so, or a line naming ``name``), or (``shown`` given: the code
    shown above it, or its ``learner.fingerprint``) it is still that code, parameters and
    body (comments and its name aside), ``unchanged`` saying why that is not an answer.
    None otherwise."""
    from labkit.pipelines import learner  # only for a code exercise

    if not callable(function):
        return check(False, "", not_a_function or
                     f"pass your function itself ({name}), not its result.")
    given = learner.fingerprint(shown) if callable(shown) else shown
    if given is not None and learner.fingerprint(function) == given:
        return check(False, "", unchanged)
    return None


def keeps_crash_points(function: Callable, points: tuple[str, ...]) -> Verdict | None:
    """A "Not yet" before anything runs for a code exercise whose ``function`` no longer
    calls ``crash_point`` at one of ``points`` (the lab could not kill it there); None when
    it calls them all."""
    from labkit.pipelines import learner  # only for a code exercise

    missing = [p for p in points if p not in learner.crash_points_in(function)]
    if not missing:
        return None
    return check(False, "", f"{function.__name__} no longer calls crash_point(\"{missing[0]}\"): "
                            "keep that line where it was, so the lab can kill it there.")


def what_it_raised(error: Exception) -> str:
    """The last line of what the learner's code raised, run as a worker (the runner's error
    ends with the worker's traceback, whose last line names the exception)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else repr(error))[:300]


def exercise(notebook: str, label: str = "") -> Callable:
    """Marks a notebook's check: with LABKIT_ROOM set, its verdict also goes to the room's
    board (``labkit.room.board``), which never stops the check from answering."""
    def mark(check_fn: Callable[..., Verdict]) -> Callable[..., Verdict]:
        @functools.wraps(check_fn)
        def run(*args, **kwargs) -> Verdict:
            verdict = check_fn(*args, **kwargs)
            from labkit.room import board  # only when a check runs: no Kafka client at import

            board.publish_verdict(notebook, label, verdict.passed, verdict.message)
            return verdict
        return run
    return mark
