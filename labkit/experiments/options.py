"""An experiment's options, and the runner's own: declared once here, each with one meaning.

    options=(records(300), seed("the input and the schedule"), keep_topics(False),
             Option("phase", REQUIRED, "which faults", tuple(PHASES)))

``Option`` is one setting: its type, default, help, choices and bounds (the CLI's flags and
the input checks both come from it). The runner's common options are made by the functions
below, so ``records`` is the same option in every experiment (how many input records,
``-n``), ``seed`` seeds what is random in a run, ``keep_topics`` keeps a run's topics,
``timeout`` bounds the whole run, and ``stall_s`` is the one meaning of a stall: an instance
alive but without progress that long (its group not waiting) is restarted. The run's
watchdog (``run(stall_after=)``, ``--stall-after``) is the registry's, not an option: it
stops a run that makes no progress at all. An experiment gives each its own default and
bounds, and declares only the options that are its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIRED = object()  # an option's default: the caller must choose


@dataclass(frozen=True)
class Option:
    """One setting of an experiment: its Python name, default and help. The CLI's flag is
    the name with dashes (a bool: a --name/--no-name switch); ``cli=False`` for data only
    Python can give (a list of records, a dict); ``cli_default`` where the terminal's
    default differs (topics are kept for a notebook's next cells, deleted by the CLI)."""

    name: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    kind: type = str
    cli: bool = True
    cli_default: Any = REQUIRED
    short: str = ""  # e.g. "-g"
    minimum: float | None = None  # the least value it takes (numbers)
    maximum: float | None = None  # the most
    why: str = ""  # why those values, said with the refusal
    positional: bool = False  # the CLI's arguments (a command after `--`), not a flag
    cli_flag: str = ""  # the CLI's flag where it is not the name with dashes

    def checked(self, experiment: str, value: Any) -> None:
        """A ValueError that says what to use, for a value not among its choices or out of
        bounds ("min_insync must be 1, 2 or 3 (why), not 4")."""
        bounded = self.choices or self.minimum is not None or self.maximum is not None
        if value is None or not bounded:
            return
        why = f" ({self.why})" if self.why else ""
        if self.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{experiment}: {self.name} must be a whole number, not {value!r}")
        if self.choices and str(value) not in self.choices:
            if self.kind in (int, float):  # numbers read as a list: "1, 2 or 3"
                *rest, last = self.choices
                spoken = f"{', '.join(rest)} or {last}" if rest else last
                raise ValueError(f"{self.name} must be {spoken}{why}, not {value}")
            raise ValueError(f"{experiment}: {self.name} must be one of "
                             f"{', '.join(self.choices)}{why}, not {value!r}")
        low, high = self.minimum, self.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = (f"{low:g} to {high:g}" if low is not None and high is not None else
                      f"{low:g} or more" if low is not None else f"{high:g} or less")
            raise ValueError(f"{self.name} must be {bounds}{why}, not {value}")

    @property
    def flag(self) -> str:
        return self.cli_flag or "--" + self.name.replace("_", "-")




def records(default: int, what: str = "input records", *, minimum: int = 1,
            maximum: int | None = None, why: str = "") -> Option:
    """How many records the run writes (``-n``); ``what`` says which, in the help."""
    return Option("records", default, f"how many {what}", kind=int, short="-n",
                  minimum=minimum, maximum=maximum, why=why)


def seed(what: str = "the input") -> Option:
    """The seed of what is random in the run (``what``: its input, its faults' moments)."""
    return Option("seed", 0, f"seeds {what}", kind=int)


def keep_topics(for_next_cells: bool) -> Option:
    """Keep the run's topics: ``for_next_cells`` where a notebook's next cells read them
    (from Python); the terminal deletes them unless asked."""
    return Option("keep_topics", for_next_cells, "keep the run's topics"
                  + (" (a notebook's next cells read them)" if for_next_cells else ""),
                  kind=bool, cli_default=False)


def timeout(default: float) -> Option:
    """Seconds for the whole run: past them it ends with an error."""
    return Option("timeout", default, "seconds for the whole run", kind=float, minimum=1)


def stall_s(default: float) -> Option:
    """The one meaning of a stall: an instance alive without progress this long (its input
    not consumed, its group not waiting) is stalled, and restarted."""
    return Option("stall_s", default, "seconds an instance may be alive without progress "
                  "(its input not consumed, its group not waiting) before it is called "
                  "stalled and restarted", kind=float, minimum=1, cli_flag="--stall-s")
