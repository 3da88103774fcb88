"""The nemesis: the faults of an experiment, as objects it composes (Jepsen's nemesis).

    nemesis = Nemesis(CrashAt("mid-batch"), KillBroker(leader, on("batch-sent", batch=2)),
                      ProxyFault("drop-ack:produce:1"))

Every fault has the same life, run by the registry for every experiment:

- ``setup(run)`` before the clients start (arm a crash point, start a fault proxy, cut a
  link that is cut from the start);
- ``invoke(run)`` when its ``trigger`` fires: an event the run reports (``on``: the clients
  sent batch 2, an instance started), a time since the clients started (``after``), or the
  n-th such event (``on(..., nth=3)``), or a time after an event (``after(2.5,
  since=on("checkpoint"))``). Event triggers fire synchronously in the thread
  that reported the event, so a fault lands exactly there (before ``commit_transaction``,
  say); time triggers fire from the nemesis's own thread;
- ``poll(run, now_s)`` every few milliseconds, for faults that keep their own clock
  (random kills after each restart, a freeze that thaws after a while);
- ``teardown(run)`` always, also after a failure, in reverse order: heal, thaw, stop.

A fault may have a guard, ``when(run)``: while it is false the fault does not fire and stays
armed, so it fires at a later event its trigger matches (a kill that needs a broker still
frozen waits for the next batch); ``repeat`` fires it at every such event. What it says on
the timeline (``says``) may be a text formatted with the run's facts, the firing event's
fields and the fault's own (``{broker}``), or a function of those.

Beside the faults, the same triggers schedule what the run needs at those moments:
``Observe`` (a look at the system whose findings join the run's facts: what a reader sees
while a transaction is open) and ``WaitUntil`` (the client that reported the event waits
there for a condition: a batch whose processing outlasts a timeout, a marker written).

``run`` is the experiment's run (``labkit.experiments.context.RunContext``): its cluster,
its clients, its ``step`` (a line of the timeline) and its ``facts``. A fault says what it
did with ``run.fired(self, what)``: the timeline shows it and the verdict can name it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from labkit.progress import beat, wait_until

POLL_S = 0.05


@dataclass(frozen=True)
class Event:
    """Something the run reports: a kind (``batch-sent``, ``instance-started``, ...) and its
    plain-data fields."""

    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)


class Trigger:
    """When a fault fires: never by default (a fault that acts in setup only, or one a
    ``labkit.faults.schedule.Schedule`` invokes)."""

    def __str__(self) -> str:
        return ""

    def fires(self, event: Event) -> bool:
        return False

    def due(self, run: "Run", now_s: float) -> bool:
        return False


@dataclass(frozen=True)
class AtLeast:
    """A field's test: its value is ``least`` or more (``on("before-commit",
    batch=at_least(4))``)."""

    least: float

    def __call__(self, value: Any) -> bool:
        return value is not None and value >= self.least

    def __str__(self) -> str:
        return f"{self.least:g} or more"


def at_least(least: float) -> AtLeast:
    return AtLeast(least)


@dataclass
class On(Trigger):
    """The ``nth`` event of ``kind`` whose fields include ``fields`` (compared as text, so
    instance 0 matches "0"; a callable is a test of the field's value, e.g. ``at_least``),
    and every such event after it for a fault that is still armed (its guard held it back)
    or fires each time (``repeat``)."""

    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    nth: int = 1
    seen: int = 0

    def fires(self, event: Event) -> bool:
        if event.kind != self.kind or not all(_matches(v, event.fields.get(k))
                                              for k, v in self.fields.items()):
            return False
        self.seen += 1
        return self.seen >= self.nth

    def __str__(self) -> str:
        what = ", ".join(f"{k}={v}" for k, v in self.fields.items())
        return f"the {_ordinal(self.nth)} {self.kind}" + (f" ({what})" if what else "")


@dataclass(frozen=True)
class After(Trigger):
    """``seconds`` after the clients started."""

    seconds: float

    def due(self, run: "Run", now_s: float) -> bool:
        return now_s >= self.seconds

    def __str__(self) -> str:
        return f"{self.seconds:g} s in"


@dataclass
class Since(Trigger):
    """``seconds`` after ``first`` fired: an event (the query's first checkpoint, say) or a
    state the nemesis's clock finds (``process_faults.Frozen``: an instance frozen)."""

    first: Trigger
    seconds: float
    at: float | None = None  # when ``first`` fired (time.monotonic)

    def fires(self, event: Event) -> bool:
        if self.at is None and self.first.fires(event):
            self.at = time.monotonic()
        return False  # its moment comes later, from the nemesis's clock

    def due(self, run: "Run", now_s: float) -> bool:
        if self.at is None and self.first.due(run, now_s):
            self.at = time.monotonic()
        return self.at is not None and time.monotonic() >= self.at + self.seconds

    def __str__(self) -> str:
        return f"{self.seconds:g} s after {self.first}"


def on(kind: str, nth: int = 1, **fields: Any) -> On:
    """The ``nth`` event of ``kind`` with these fields."""
    if nth < 1:
        raise ValueError(f"nth counts events from 1, not {nth}")
    return On(kind, fields, nth)


def after(seconds: float, since: Trigger | None = None) -> Trigger:
    """``seconds`` after the clients started, or after ``since`` fired (``on(...)``)."""
    if seconds < 0:
        raise ValueError(f"a fault cannot fire {seconds} s before "
                         f"{since or 'the clients start'}")
    return After(seconds) if since is None else Since(since, seconds)


def _matches(expected: Any, value: Any) -> bool:
    return expected(value) if callable(expected) else str(value) == str(expected)


class Run(Protocol):
    """What a fault may use of the run it breaks (labkit.experiments.context.RunContext)."""

    bootstrap: str
    cluster: Any
    clients: Any
    facts: Mapping[str, Any]  # read-only: a part adds to it with ``observe``

    def observe(self, **facts: Any) -> None: ...

    def step(self, what: str, waiting_for: str | None = ..., detail: str = "") -> None: ...

    def fired(self, fault: "Fault", what: str, **fields: Any) -> None: ...

    def event(self, kind: str, **fields: Any) -> bool: ...


# What a part says on the timeline: a text formatted with the run's facts, the firing
# event's fields and the part's own, or a function of that mapping.
Says = str | Callable[[Mapping[str, Any]], str]


class Fault:
    """One fault: set up, invoked when its trigger fires (once, unless ``repeat``; not while
    its guard ``when(run)`` is false), polled, torn down. Subclasses override what they
    need; ``name`` is how the verdict names it, ``says`` what the timeline says."""

    name = "fault"
    trigger: Trigger = Trigger()
    repeat = False
    when: Callable[[Any], bool] | None = None
    says: Says | None = None
    fired_by: Event | None = None  # the event that fired it last (None: a time)

    def told(self, run: Run, default: str = "", template: Says | None = None,
             **own: Any) -> str:
        """The timeline's line for what it did: ``template`` (default: its ``says``) with
        the run's facts, the firing event's fields and ``own``; ``default`` without one."""
        says = self.says if template is None else template
        if says is None:
            return default
        fields = {**run.facts, **(self.fired_by.fields if self.fired_by else {}), **own}
        return says(fields) if callable(says) else says.format(**fields)

    def setup(self, run: Run) -> None:
        """Before the clients start."""

    def invoke(self, run: Run) -> None:
        """When the trigger fires."""

    def poll(self, run: Run, now_s: float) -> None:
        """Every few milliseconds while the clients run (``now_s``: since they started)."""

    def teardown(self, run: Run) -> None:
        """Always, after the clients (heal, thaw, stop what setup started)."""

    def __str__(self) -> str:
        return self.name


class Nemesis:
    """Faults composed: set up in order, fired by their triggers, torn down in reverse."""

    def __init__(self, *faults: Fault):
        self.faults = tuple(faults)
        self._fired: set[int] = set()
        self._lock = threading.RLock()  # a fault's invoke may report events of its own
        self._started: float | None = None

    def __iter__(self) -> Iterator[Fault]:
        return iter(self.faults)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def of(self, kind: type) -> list[Fault]:
        return [f for f in self.faults if isinstance(f, kind)]

    def notify(self, run: Run, event: Event) -> bool:
        """Fire every fault whose trigger this event is (in the reporting thread); whether
        one did (it told the timeline that moment's story: the client need not)."""
        fired = False
        with self._lock:
            for i, fault in enumerate(self.faults):
                if (fault.repeat or i not in self._fired) and fault.trigger.fires(event) \
                        and _allowed(fault, run):
                    self._fired.add(i)
                    fault.fired_by = event
                    fault.invoke(run)
                    fired = True
        return fired

    def elapsed(self) -> float:
        return 0.0 if self._started is None else time.monotonic() - self._started

    def _tick(self, run: Run) -> None:
        now = self.elapsed()
        with self._lock:
            for i, fault in enumerate(self.faults):
                if (fault.repeat or i not in self._fired) and fault.trigger.due(run, now) \
                        and _allowed(fault, run):
                    self._fired.add(i)
                    fault.fired_by = None
                    fault.invoke(run)
                fault.poll(run, now)

    @contextmanager
    def active(self, run: Run) -> Iterator["Nemesis"]:
        """Set up every fault, poll them from a thread of their own while the block runs
        (the clients), tear every one down after it, whatever happened."""
        ready: list[Fault] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def poller() -> None:
            while not stop.wait(POLL_S):
                try:
                    self._tick(run)
                except BaseException as exc:  # raised in the run's thread, after the clients
                    errors.append(exc)
                    return

        thread = threading.Thread(target=poller, name="nemesis", daemon=True)
        try:
            for fault in self.faults:
                fault.setup(run)
                ready.append(fault)
            self._started = time.monotonic()
            thread.start()
            yield self
        finally:
            stop.set()
            if thread.is_alive():
                thread.join()
            _teardown(ready, run)
        if errors:
            raise errors[0]


def _allowed(fault: Fault, run: Run) -> bool:
    return fault.when is None or bool(fault.when(run))


@dataclass(frozen=True)
class Until:
    """A condition on the run that a part waits for: ``holds(run)``, ``what`` it waits for
    (the watchdog's and the TimeoutError's words), at most ``timeout_s``."""

    holds: Callable[[Any], bool]
    what: str
    timeout_s: float = 60.0

    def wait(self, run: Run) -> float:
        """Wait (in the calling thread) until it holds; the seconds it took."""
        began = time.monotonic()
        wait_until(lambda: self.holds(run), self.what, self.timeout_s)
        return time.monotonic() - began


class Observe(Fault):
    """Not a fault: a look at the system when ``trigger`` fires. ``look(run)`` returns
    findings that join the run's facts (what a read_committed reader sees while a
    transaction is open, where a coordinator moved); ``says`` makes it a line of the
    timeline (formatted with the findings among the facts)."""

    def __init__(self, trigger: Trigger, look: Callable[[Any], dict], says: Says | None = None,
                 when: Callable[[Any], bool] | None = None, name: str = "an observation"):
        self.trigger, self.look, self.says, self.when, self.name = trigger, look, says, when, name

    def invoke(self, run: Run) -> None:
        run.observe(**self.look(run))
        if self.says is not None:
            run.step(self.told(run), None)


class WaitUntil(Fault):
    """The client that reported ``trigger``'s event waits there (its thread: the nemesis
    fires event triggers synchronously) until ``until`` holds: a batch whose processing
    outlasts a timeout, a loop held until a marker is written. ``starting`` is the
    timeline's line as it begins (a fault the verdict names), ``says`` once it holds;
    ``waited_s`` how long it took."""

    def __init__(self, trigger: Trigger, until: Until, says: Says | None = None,
                 starting: Says | None = None, when: Callable[[Any], bool] | None = None,
                 name: str = ""):
        self.trigger, self.until, self.says, self.when = trigger, until, says, when
        self.starting = starting
        self.name = name or f"a wait for {until.what}"
        self.waited_s: float | None = None

    def invoke(self, run: Run) -> None:
        if self.starting is not None:
            run.fired(self, self.told(run, template=self.starting))
        beat(self.until.what)  # what the watchdog names if the wait never ends
        self.waited_s = self.until.wait(run)
        if self.says is not None:
            run.step(self.told(run), None)


def _teardown(faults: list[Fault], run: Run) -> None:
    """Each fault's teardown, last first, every one even if one fails (the first error is
    raised once all have run: a broker left frozen would outlive the run)."""
    first: BaseException | None = None
    for fault in reversed(faults):
        try:
            fault.teardown(run)
        except BaseException as exc:
            first = first or exc
    if first is not None:
        raise first


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")
