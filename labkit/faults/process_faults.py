"""Faults done to the application's processes (``labkit.faults.pool.WorkerPool``, the run's
``workers``): a crash at a named point, SIGKILLs at random moments, a freeze and a thaw,
a member that joins or leaves the group, a successor that fences an instance.

    Nemesis(CrashAt("mid-batch", hit=2), RandomKills(3, between=(1, 4), seed=7),
            Join(on("processed", nth=3)), Freeze(1, after(5), for_s=8))
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable

from labkit import progress
from labkit.faults import crashpoints
from labkit.faults.nemesis import Fault, Run, Trigger
from labkit.faults.pool import WorkerFailed


Instance = int | Callable[[Run], int]  # a number, or chosen when the fault fires


def _target(instance: Instance, run: Run) -> int:
    return instance(run) if callable(instance) else instance


def any_running(seed: int) -> Callable[[Run], int]:
    """A seeded choice, when the fault fires, among the instances running then."""
    rng = random.Random(seed)

    def pick(run: Run) -> int:
        running = [i for i in range(len(run.workers.instances)) if run.workers.running(i)]
        return rng.choice(running) if running else 0
    return pick


class CrashAt(Fault):
    """Instance ``instance``'s first start SIGKILLs itself at ``point``'s ``hit``-th visit
    (``labkit.faults.crashpoints``): nothing flushed, closed or committed. ``instance``
    None: every instance's first start (whichever gets there: in a group, which instance
    gets which partitions is the coordinator's choice)."""

    def __init__(self, point: str, hit: int = 2, instance: int | None = 0):
        crashpoints.arm(point, hit)  # an unknown point is refused here, listing the valid ones
        self.point, self.hit, self.instance = point, hit, instance
        self.name = f"crash at {point}"

    def setup(self, run: Run) -> None:
        every = range(len(run.workers.instances)) if self.instance is None else [self.instance]
        for i in every:
            run.workers.arm(i, self.point, self.hit)


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

    def stalled_s(self, thawed_at: float | None) -> float:
        """How long the instance stayed frozen, until ``thawed_at`` (``Thaw.thawed_at``; None:
        until now). WorkerFailed if it never got there: its code does not pass the point,
        or passed it fewer than ``hit`` times, and the run it was for did not happen."""
        if self.frozen_at is None:
            raise WorkerFailed(f"instance {self.instance} never reached its stall point "
                               f"{self.point!r} (visit {self.hit}): it ran to its end unfrozen")
        return round((thawed_at or time.monotonic()) - self.frozen_at, 3)


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
    """One SIGKILL of instance ``instance`` when ``trigger`` fires (it is restarted); without
    a trigger, when a ``Schedule`` says. ``name``: what the timeline calls it ("SIGKILL the
    app's JVM")."""

    def __init__(self, instance: Instance = 0, trigger: Trigger | None = None, name: str = ""):
        self.instance, self.trigger = instance, trigger or Trigger()
        self.name = name or "an instance SIGKILLed"

    def invoke(self, run: Run) -> None:
        i = _target(self.instance, run)
        if run.workers.kill(i):
            what = self.name if self.name != "an instance SIGKILLed" else f"instance {i} SIGKILLed"
            run.fired(self, what + (f" ({self.trigger})" if str(self.trigger) else ""))


class Pause(Fault):
    """The client that reported the trigger's event goes idle for ``seconds`` (it sleeps in
    its own thread: a producer left idle past a broker's expiration, a long pause of the
    process), then carries on where it stopped; with ``until``, as soon as ``until(run)``
    says (``what``: e.g. "instance B has taken the input over"), ``seconds`` at most. Idle
    is not stalled: the watchdog is told. ``paused_s``: how long it stayed."""

    def __init__(self, trigger: Trigger, seconds: float, who: str = "the client",
                 until: Callable[[Run], bool] | None = None, what: str = ""):
        if seconds < 0:
            raise ValueError(f"a pause lasts 0 seconds or more, not {seconds}")
        self.trigger, self.seconds, self.who = trigger, seconds, who
        self.until, self.what = until, what or "it may go on"
        self.name = f"{who} idle {seconds:g} s" if until is None else f"{who} held up"
        self.paused_s: float | None = None

    def invoke(self, run: Run) -> None:
        run.fired(self, f"{self.who} idle for {self.seconds:.0f} s ({self.trigger})"
                  if self.until is None else f"{self.who} held up until {self.what} "
                  f"({self.trigger}; {self.seconds:.0f} s at most)")
        started = time.monotonic()
        while (left := started + self.seconds - time.monotonic()) > 0:
            if self.until is not None and self.until(run):
                break
            time.sleep(min(left, 1.0 if self.until is None else 0.1))
            progress.beat(f"{self.who} to wake up")
        self.paused_s = time.monotonic() - started


class Freeze(Fault):
    """Instance ``instance`` frozen (SIGSTOP) when ``trigger`` fires, thawed (SIGCONT)
    ``for_s`` later, or as soon as ``until(run)`` says (e.g. the group has moved its
    partitions on), ``for_s`` at most: it comes back a zombie."""

    def __init__(self, instance: Instance, trigger: Trigger | None = None, for_s: float = 10.0,
                 until: Callable[[Run, int], bool] | None = None):
        self.instance, self.trigger, self.for_s = instance, trigger or Trigger(), for_s
        self.until = until  # until(run, instance): the group has moved on without it
        self.name = "an instance frozen, then back (a zombie)"
        self._thaw_at: float | None = None
        self._frozen_at = 0.0

    def invoke(self, run: Run) -> None:
        self.instance = _target(self.instance, run)
        if run.workers.freeze(self.instance):
            self._frozen_at = time.monotonic()
            self._thaw_at = self._frozen_at + self.for_s
            run.fired(self, f"instance {self.instance} frozen ({self.trigger})"
                      if str(self.trigger) else f"instance {self.instance} frozen")

    def poll(self, run: Run, now_s: float) -> None:
        if self._thaw_at is None:
            return
        moved_on = self.until is not None and self.until(run, self.instance)
        if moved_on or time.monotonic() >= self._thaw_at:
            self._thaw_at = None
            run.workers.thaw(self.instance)
            why = "the group moved on without it" if moved_on else "its time was up"
            run.fired(self, f"instance {self.instance} thawed after "
                            f"{time.monotonic() - self._frozen_at:.1f} s ({why})")

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
    (e.g. its own transactional.id; a function of the run and the new instance's number
    when they depend on the run) is started; the group rebalances."""

    def __init__(self, trigger: Trigger | None = None,
                 settings: dict | Callable[[Run, int], dict] | None = None, name: str = ""):
        self.trigger, self.settings = trigger or Trigger(), settings or {}
        self.name = name or "a member joins"
        self.joined: int | None = None

    def invoke(self, run: Run) -> None:
        settings = self.settings(run, len(run.workers.instances)) if callable(self.settings) \
            else self.settings
        self.joined = run.workers.add(settings)
        run.fired(self, f"instance {self.joined} joins the group")


class Leave(Fault):
    """Instance ``instance`` leaves for good when ``trigger`` fires (SIGTERM, then
    SIGKILL): the group rebalances its partitions to the others."""

    def __init__(self, instance: Instance, trigger: Trigger | None = None):
        self.instance, self.trigger = instance, trigger or Trigger()
        self.name = "a member leaves"

    def invoke(self, run: Run) -> None:
        i = _target(self.instance, run)
        run.workers.leave(i)
        run.fired(self, f"instance {i} leaves the group")


class Replace(Fault):
    """A successor of instance ``instance`` with its settings (so its transactional.id)
    starts when ``trigger`` fires: the old one is fenced and should stop; it is not
    started again. With ``settings(run, n)`` the successor (instance ``n``) is a member of
    its own (its own group.instance.id, say) and takes only the settings named in ``keep``
    from the old one: fenced by its transactional.id alone, not by its consumer."""

    def __init__(self, instance: Instance, trigger: Trigger | None = None,
                 settings: Callable[[Run, int], dict] | None = None, keep: tuple = ()):
        self.instance, self.trigger = instance, trigger or Trigger()
        self.settings, self.keep = settings, keep
        self.name = "an instance fenced by a successor with its transactional.id"
        self.successor: int | None = None
        self.fenced: int | None = None

    def invoke(self, run: Run) -> None:
        self.fenced = self.instance = _target(self.instance, run)
        changes = {}
        if self.settings is not None:
            old = run.workers.instances[self.fenced].kwargs
            changes = {**self.settings(run, len(run.workers.instances)),
                       **{k: old[k] for k in self.keep if k in old}}
        self.successor = run.workers.replace(self.instance, **changes)
        run.fired(self, f"instance {self.successor} starts with instance {self.instance}'s "
                        "transactional.id", fenced=self.fenced, successor=self.successor)
