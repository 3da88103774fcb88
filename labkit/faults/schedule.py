"""A seeded schedule of faults: one after another, in a seeded order, each a seeded random
delay after the previous one ended, as ``labkit torture`` and the judge inject them.

    Schedule([Kill(0), Kill(0), KillBroker(1, restart=True)], between=(1, 4), seed=7)
    Schedule(..., clock="commit", offsets_committed=lambda run: run.progress.sample(fresh=True)[0])

``clock="start"``: each delay counts from the previous fault (or the clients' start).
``clock="commit"``: from the app's first offset commit after that, so with a delay shorter
than the app's commit interval every fault lands between two of its commits, however long
its restart took (a JVM may take seconds on a loaded machine, and a kill during its start
hits nothing the app has processed). The same seed gives the same order and delays.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from labkit.faults.nemesis import Fault, Run

CLOCKS = ("start", "commit")


class Schedule(Fault):
    def __init__(self, faults: Sequence[Fault], between: tuple[float, float], seed: int = 0,
                 clock: str = "start", offsets_committed: Callable[[Run], int] | None = None,
                 shuffle: bool = True, name: str = "a seeded schedule of faults"):
        low, high = between
        if not 0 < low <= high:
            raise ValueError(f"between must be (min, max) seconds with 0 < min <= max, not "
                             f"{between}")
        if clock not in CLOCKS:
            raise ValueError(f"unknown clock {clock!r}: use 'start' (delays count from the "
                             "previous fault) or 'commit' (from the app's first offset commit "
                             "after it)")
        if clock == "commit" and offsets_committed is None:
            raise ValueError("clock='commit' needs offsets_committed(run): the group's committed offsets")
        self.rng = random.Random(seed)
        self.remaining = list(faults)
        if shuffle:
            self.rng.shuffle(self.remaining)  # the seed decides the interleaving too
        self.between, self.clock, self.offsets_committed = between, clock, offsets_committed
        self.name = name
        self.done: list[Fault] = []
        self._delay = 0.0
        self._due: float | None = None
        self._since_commit = 0
        self._armed = False

    def setup(self, run: Run) -> None:
        for fault in self.remaining:  # each fault it holds, as the nemesis would
            fault.setup(run)
        self._held = list(self.remaining)

    def teardown(self, run: Run) -> None:
        first: BaseException | None = None
        for fault in reversed(getattr(self, "_held", [])):
            try:
                fault.teardown(run)
            except BaseException as exc:  # every one torn down; the first error raised
                first = first or exc
        if first is not None:
            raise first

    @property
    def pending(self) -> bool:
        return bool(self.remaining)

    @property
    def waiting_for_commit(self) -> bool:
        """Its next fault waits for the app's next commit to start its delay."""
        return self.pending and self._armed and self._due is None

    def cancel(self) -> list[Fault]:
        """The faults not injected (the clients finished first)."""
        left, self.remaining = self.remaining, []
        return left

    def _arm(self, run: Run) -> None:
        self._delay = self.rng.uniform(*self.between)
        self._armed = True
        if self.clock == "start":
            self._due = time.monotonic() + self._delay
        else:
            self._due, self._since_commit = None, self.offsets_committed(run)

    def poll(self, run: Run, now_s: float) -> None:
        self.poll_held(run, now_s)
        if not self.remaining:
            return
        if not self._armed:
            self._arm(run)
        if self._due is None:  # clock "commit": waiting for the app's next commit
            if self.offsets_committed(run) > self._since_commit:
                self._due = time.monotonic() + self._delay
            return
        if time.monotonic() < self._due or not self.ready(run):
            return
        fault = self.remaining.pop(0)
        fault.invoke(run)
        self.done.append(fault)
        self._armed = False  # the next delay counts from now (after a restart, if any)

    def poll_held(self, run: Run, now_s: float) -> None:
        """The held faults' own clocks (a freeze that thaws, a kill that waits)."""
        for fault in self.done:
            fault.poll(run, now_s)

    def ready(self, run: Run) -> bool:
        """A fault lands on running clients: none while an app is between two starts."""
        workers = getattr(run, "workers", None)
        return workers is None or any(workers.running(i) for i in range(len(workers.instances)))
