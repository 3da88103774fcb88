"""Faults done to the application's processes (``labkit.faults.pool.WorkerPool``, the run's
``workers``): a crash at a named point, SIGKILLs at random moments, a freeze and a thaw,
a member that joins or leaves the group, a successor that fences an instance.

    Nemesis(CrashAt("mid-batch", hit=2), RandomKills(3, between=(1, 4), seed=7),
            Join(on("processed", nth=3)), Freeze(1, after(5), for_s=8))
"""
from __future__ import annotations

import random
import time

from labkit import progress
from labkit.faults import crashpoints
from labkit.faults.nemesis import Fault, Run, Trigger


class CrashAt(Fault):
    """Instance ``instance``'s first start SIGKILLs itself at ``point``'s ``hit``-th visit
    (``labkit.faults.crashpoints``): nothing flushed, closed or committed."""

    def __init__(self, point: str, hit: int = 2, instance: int = 0):
        crashpoints.arm(point, hit)  # an unknown point is refused here, listing the valid ones
        self.point, self.hit, self.instance = point, hit, instance
        self.name = f"crash at {point}"

    def setup(self, run: Run) -> None:
        run.workers.arm(self.instance, self.point, self.hit)


class StallAt(Fault):
    """Instance ``instance`` freezes itself (SIGSTOP) at ``point``'s ``hit``-th visit, its
    connections open and its heartbeats stopped, until something thaws it."""

    def __init__(self, point: str, hit: int = 1, instance: int = 0):
        crashpoints.arm(point, hit, stall=True)
        self.point, self.hit, self.instance = point, hit, instance
        self.name = f"freeze at {point}"
        self.frozen_at: float | None = None

    def setup(self, run: Run) -> None:
        run.workers.arm(self.instance, self.point, self.hit, stall=True)

    def poll(self, run: Run, now_s: float) -> None:
        if self.frozen_at is None and run.workers.frozen(self.instance):
            self.frozen_at = time.monotonic()
            run.fired(self, f"instance {self.instance} frozen at {self.point}")


class Frozen(Trigger):
    """Fires once instance ``instance`` is frozen (SIGSTOP), however it got there."""

    def __init__(self, instance: int):
        self.instance = instance

    def due(self, run: Run, now_s: float) -> bool:
        return run.workers.frozen(self.instance)

    def __str__(self) -> str:
        return f"instance {self.instance} frozen"


class RandomKills(Fault):
    """SIGKILL instance ``instance`` ``count`` times, each a seeded random time (``between``
    seconds) after its latest start, wherever its code is then."""

    def __init__(self, count: int, between: tuple[float, float] = (1.0, 4.0),
                 instance: int = 0, seed: int = 0):
        low, high = between
        if count < 0 or not 0 < low <= high:
            raise ValueError(f"need kills >= 0 and 0 < min <= max seconds, not {count} and "
                             f"{between}")
        self.count, self.between, self.instance = count, between, instance
        self.rng = random.Random(seed)
        self.done = 0
        self.name = f"{count} SIGKILLs at random moments"
        self._start: float | None = None
        self._due = float("inf")

    def poll(self, run: Run, now_s: float) -> None:
        if self.done >= self.count:
            return
        started = run.workers.started_at(self.instance)
        if started is None:
            return
        if started != self._start:  # a new start: its kill is drawn now
            self._start, self._due = started, started + self.rng.uniform(*self.between)
        if time.monotonic() >= self._due:
            self._due = float("inf")
            if run.workers.kill(self.instance):
                self.done += 1
                run.fired(self, f"instance {self.instance} SIGKILLed at a random moment "
                                f"({self.done} of {self.count})")


class Kill(Fault):
    """One SIGKILL of instance ``instance`` when ``trigger`` fires (it is restarted);
    ``name``: what the timeline calls it ("SIGKILL the app's JVM")."""

    def __init__(self, instance: int, trigger: Trigger, name: str = ""):
        self.instance, self.trigger = instance, trigger
        self.name = name or f"instance {instance} SIGKILLed"

    def invoke(self, run: Run) -> None:
        if run.workers.kill(self.instance):
            run.fired(self, f"{self.name} ({self.trigger})")


class Pause(Fault):
    """The client that reported the trigger's event goes idle for ``seconds`` (it sleeps in
    its own thread: a producer left idle past a broker's expiration, a long pause of the
    process), then carries on where it stopped. Idle is not stalled: the watchdog is told."""

    def __init__(self, trigger: Trigger, seconds: float, who: str = "the client"):
        if seconds < 0:
            raise ValueError(f"a pause lasts 0 seconds or more, not {seconds}")
        self.trigger, self.seconds, self.who = trigger, seconds, who
        self.name = f"{who} idle {seconds:g} s"

    def invoke(self, run: Run) -> None:
        run.fired(self, f"{self.who} idle for {self.seconds:.0f} s ({self.trigger})")
        until = time.monotonic() + self.seconds
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, 1.0))
            progress.beat(f"{self.who} to wake up")


class Freeze(Fault):
    """Instance ``instance`` frozen (SIGSTOP) when ``trigger`` fires, thawed (SIGCONT)
    ``for_s`` later: longer than its session or poll interval, it comes back a zombie."""

    def __init__(self, instance: int, trigger: Trigger, for_s: float):
        self.instance, self.trigger, self.for_s = instance, trigger, for_s
        self.name = f"instance {instance} frozen {for_s:g} s"
        self._thaw_at: float | None = None

    def invoke(self, run: Run) -> None:
        if run.workers.freeze(self.instance):
            self._thaw_at = time.monotonic() + self.for_s
            run.fired(self, f"instance {self.instance} frozen for {self.for_s:g} s")

    def poll(self, run: Run, now_s: float) -> None:
        if self._thaw_at is not None and time.monotonic() >= self._thaw_at:
            self._thaw_at = None
            run.workers.thaw(self.instance)
            run.fired(self, f"instance {self.instance} thawed")

    def teardown(self, run: Run) -> None:
        if self._thaw_at is not None:  # never leave a frozen process behind
            self._thaw_at = None
            run.workers.thaw(self.instance)


class Thaw(Fault):
    """Instance ``instance`` thawed (SIGCONT) when ``trigger`` fires."""

    def __init__(self, instance: int, trigger: Trigger):
        self.instance, self.trigger = instance, trigger
        self.name = f"instance {instance} thawed"
        self.thawed_at: float | None = None

    def invoke(self, run: Run) -> None:
        run.workers.thaw(self.instance)
        self.thawed_at = time.monotonic()
        run.fired(self, f"instance {self.instance} thawed ({self.trigger})")

    def teardown(self, run: Run) -> None:
        run.workers.thaw(self.instance)  # never leave a frozen process behind


class Join(Fault):
    """A new member joins the group when ``trigger`` fires: an instance with ``settings``
    (e.g. its own transactional.id) is started; the group rebalances."""

    def __init__(self, trigger: Trigger, settings: dict | None = None, name: str = ""):
        self.trigger, self.settings = trigger, settings or {}
        self.name = name or "a member joins"
        self.joined: int | None = None

    def invoke(self, run: Run) -> None:
        self.joined = run.workers.add(self.settings)
        run.fired(self, f"instance {self.joined} joins the group ({self.trigger})")


class Leave(Fault):
    """Instance ``instance`` leaves for good when ``trigger`` fires (SIGTERM, then
    SIGKILL): the group rebalances its partitions to the others."""

    def __init__(self, instance: int, trigger: Trigger):
        self.instance, self.trigger = instance, trigger
        self.name = f"instance {instance} leaves"

    def invoke(self, run: Run) -> None:
        run.workers.leave(self.instance)
        run.fired(self, f"instance {self.instance} leaves the group ({self.trigger})")


class Replace(Fault):
    """A successor of instance ``instance`` with its settings (so its transactional.id)
    starts when ``trigger`` fires: the old one is fenced and should stop; it is not
    started again."""

    def __init__(self, instance: int, trigger: Trigger):
        self.instance, self.trigger = instance, trigger
        self.name = f"instance {instance} fenced by a successor"
        self.successor: int | None = None

    def invoke(self, run: Run) -> None:
        self.successor = run.workers.replace(self.instance)
        run.fired(self, f"instance {self.successor} starts with instance {self.instance}'s "
                        f"transactional.id ({self.trigger})")
