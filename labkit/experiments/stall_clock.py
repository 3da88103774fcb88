"""The clocks of an app's supervision (``labkit.experiments.app_run``): when its output
has been quiet long enough, how long it has gone without progress, and what a stall was.
Plain data and time, no Kafka: the supervision samples, these keep count."""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Stall:
    """The app stayed alive without progress for ``stalled_s`` and was SIGKILLed and started
    again. ``after_s``: seconds into the run when its last progress was seen."""

    after_s: float
    stalled_s: float
    consumed: int  # the group's committed offsets on the input, then
    end: int  # the input's end offsets
    written: int  # the output's size as the watch samples it
    attempt: int  # the start of the app that stalled (1: the first)
    stacks: str = ""  # the file in the run's directory with its threads' stacks, if any

    def text(self) -> str:
        where = f"; where it waited: {self.stacks}" if self.stacks else ""
        return f"no progress for {self.stalled_s:.0f} s after {self.after_s:.1f} s{where}"


class Quiet:
    """Has a number stayed the same for a while? (the output's size, sampled)"""

    def __init__(self) -> None:
        self.value: int | None = None
        self.since = time.monotonic()

    def still(self, value: int, for_s: float) -> bool:
        if value != self.value:
            self.value, self.since = value, time.monotonic()
        return time.monotonic() - self.since >= for_s


class Progress:
    """When did the app last make progress (its committed offsets or the output changed)?

    The clock starts over at each new ``epoch`` (a start of the app, a fault): a start takes
    its time before the first commit. Progress is only judged while the app has committed
    something and not yet its whole input: an app that never commits cannot show how far
    it got (``app_run.IDLE_S`` covers it), and one that has consumed everything is finishing."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.seen: tuple[int, int, int] = (0, 0, 0)  # (consumed, end, written)
        self.epoch: object = None
        self.since = time.monotonic()

    def stalled_s(self, consumed: int, end: int, written: int, epoch: object) -> float:
        """Seconds without progress so far (0 while progress cannot be judged)."""
        now = time.monotonic()
        if epoch != self.epoch or (consumed, written) != (self.seen[0], self.seen[2]):
            self.epoch, self.since = epoch, now
        self.seen = (consumed, end, written)
        return now - self.since if 0 < consumed < end else 0.0
