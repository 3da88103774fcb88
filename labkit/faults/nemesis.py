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

``run`` is the experiment's run (``labkit.experiments.context.RunContext``): its cluster,
its clients, its ``step`` (a line of the timeline) and its ``facts``. A fault says what it
did with ``run.fired(self, what)``: the timeline shows it and the verdict can name it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

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


@dataclass
class On(Trigger):
    """The ``nth`` event of ``kind`` whose fields include ``fields`` (compared as text, so
    instance 0 matches "0")."""

    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    nth: int = 1
    seen: int = 0

    def fires(self, event: Event) -> bool:
        if event.kind != self.kind or any(str(event.fields.get(k)) != str(v)
                                          for k, v in self.fields.items()):
            return False
        self.seen += 1
        return self.seen == self.nth

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


class Run(Protocol):
    """What a fault may use of the run it breaks (labkit.experiments.context.RunContext)."""

    bootstrap: str
    cluster: Any
    clients: Any
    facts: dict

    def step(self, what: str, waiting_for: str = ..., detail: str = "") -> None: ...

    def fired(self, fault: "Fault", what: str) -> None: ...


class Fault:
    """One fault: set up, invoked when its trigger fires (once, unless ``repeat``), polled,
    torn down. Subclasses override what they need; ``name`` is how the verdict names it."""

    name = "fault"
    trigger: Trigger = Trigger()
    repeat = False

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

    def notify(self, run: Run, event: Event) -> None:
        """Fire every fault whose trigger this event is (in the reporting thread)."""
        with self._lock:
            for i, fault in enumerate(self.faults):
                if (fault.repeat or i not in self._fired) and fault.trigger.fires(event):
                    self._fired.add(i)
                    fault.invoke(run)

    def elapsed(self) -> float:
        return 0.0 if self._started is None else time.monotonic() - self._started

    def _tick(self, run: Run) -> None:
        now = self.elapsed()
        with self._lock:
            for i, fault in enumerate(self.faults):
                if (fault.repeat or i not in self._fired) and fault.trigger.due(run, now):
                    self._fired.add(i)
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
