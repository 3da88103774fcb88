"""Faults done to the brokers of a local lab (``run.cluster``, a LocalCluster): a SIGKILL
and a restart, a freeze and a thaw, a broker cut off from the others and healed.

    Nemesis(KillBroker(lambda run: coordinator_of(run), on("before-commit", batch=2)),
            RestartBroker(on("batch-ended", batch=2)),
            FreezeBroker(1, after(3), thaw_after_s=20))

Which broker may be a number, or a function of the run that says it when the fault fires
(the transaction coordinator moves when its broker dies: only the run knows where it is
then). Every fault leaves the lab whole when it is torn down: killed brokers restarted,
frozen ones thawed, cut links healed (never once the run's watchdog has stopped it: a
broker started then would outlive the run). Each takes the nemesis's ``says`` (its line on
the timeline; ``{broker}`` is the broker it acted on) and ``when`` (its guard).
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from labkit import progress
from labkit.checking import history
from labkit.faults.nemesis import Fault, Run, Says, Trigger

Broker = int | Callable[[Any], int] | None  # None: every broker of the lab


def _which(broker: Broker, run: Run) -> int | None:
    return broker(run) if callable(broker) else broker


def _history(run: Run, kind: str, **fields: Any) -> None:
    """The fault in the run's history too (a tortured app's timeline shows broker kills)."""
    path = getattr(run, "history_file", None)
    if path is not None:
        history.append(path, kind, **fields)


class KillBroker(Fault):
    """SIGKILL a broker when ``trigger`` fires; ``restart``: start it again at once (the
    run goes on against the others meanwhile, its restart waited for); else it stays down
    until teardown (or a ``RestartBroker``) starts it. ``killed``: the brokers it killed."""

    def __init__(self, broker: Broker, trigger: Trigger | None = None, restart: bool = False,
                 name: str = "", repeat: bool = False, says: Says | None = None,
                 when: Callable[[Any], bool] | None = None):
        self.broker, self.restart, self.repeat = broker, restart, repeat
        self.trigger = trigger or Trigger()
        self.says, self.when = says, when
        self.name = name or "a broker SIGKILLed"
        self.killed: list[int] = []

    def invoke(self, run: Run) -> None:
        node = _which(self.broker, run)
        which = "the broker" if node is None else f"broker {node}"
        _history(run, "broker-killed", broker=node)
        run.cluster.kill(node)
        self.killed.append(node)
        run.fired(self, self.told(run, f"{which} SIGKILLed" + (
            f" ({self.trigger})" if str(self.trigger) else ""), broker=node))
        if self.restart:
            progress.check()  # a run its watchdog stopped starts no broker again
            run.cluster.restart(node)
            _history(run, "broker-restarted", broker=node)
            run.fired(self, f"{which} restarted")

    def teardown(self, run: Run) -> None:
        if self.killed and not self.restart:
            progress.check()
            run.cluster.restart()  # every broker up again, for the audit and the next run


class RestartBroker(Fault):
    """Start the killed broker ``broker`` (default: every killed broker of the lab) again
    when ``trigger`` fires (``wait``: until they answer)."""

    def __init__(self, trigger: Trigger, wait: bool = True, broker: Broker | None = None,
                 says: Says | None = None, when: Callable[[Any], bool] | None = None):
        self.trigger, self.wait, self.broker, self.says, self.when = \
            trigger, wait, broker, says, when
        self.name = "killed brokers restarted"

    def invoke(self, run: Run) -> None:
        node = None if self.broker is None else _which(self.broker, run)
        progress.check()  # a run its watchdog stopped starts no broker again
        run.cluster.restart(node, wait=self.wait)
        run.fired(self, self.told(run, "killed brokers restarted" if node is None else
                                  f"broker {node} restarted", broker=node))


class FreezeBroker(Fault):
    """SIGSTOP a broker when ``trigger`` fires: alive to the kernel, silent to everyone (a
    long GC pause, a hung disk). Thawed ``thaw_after_s`` later (a timer: a freeze must
    never outlast its purpose and deadlock the run), by ``thaw()`` (or a ``ThawBroker``),
    or at teardown. ``ready(run)``, when given, is waited for before the freeze (every
    replica of a partition in sync, say); ``repeat``: frozen again at each firing (its
    guard says when no more)."""

    def __init__(self, broker: Broker, trigger: Trigger, thaw_after_s: float | None = None,
                 name: str = "", says: Says | None = None,
                 when: Callable[[Any], bool] | None = None, repeat: bool = False,
                 ready: Callable[[Any], Any] | None = None):
        self.broker, self.trigger, self.thaw_after_s = broker, trigger, thaw_after_s
        self.says, self.when, self.repeat, self.ready = says, when, repeat, ready
        self.name = name or "a broker frozen"
        self.node: int | None = None
        self.expired = False  # the timer thawed it (until the next freeze or thaw())
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._run: Run | None = None

    @property
    def active(self) -> bool:
        """Frozen now."""
        return self.node is not None

    def invoke(self, run: Run) -> None:
        node = _which(self.broker, run)
        if self.ready is not None:
            self.ready(run)
        with self._lock:
            self._run, self.node, self.expired = run, node, False
            run.cluster.freeze(node)
            if self.thaw_after_s is not None:
                self._timer = threading.Timer(self.thaw_after_s, self._expire)
                self._timer.daemon = True
                self._timer.start()
        run.fired(self, self.told(run, f"broker {node} frozen ({self.trigger})", broker=node))

    def stop_timer(self) -> bool:
        """Stop the timer; True if it had already thawed the broker (the freeze is over)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return self.expired

    def still_frozen(self) -> bool:
        """Stop the timer and say whether the broker is frozen still: from here on only a
        thaw ends the freeze (a guard for a fault that needs it frozen while it acts)."""
        return not self.stop_timer() and self.active

    def thaw(self) -> bool:
        """Thaw it now (the timer stopped); whether a freeze ended here or by the timer
        since it began (False: it was not frozen)."""
        ended = self.stop_timer() or self.active
        self._thaw()
        self.expired = False
        return ended

    def _expire(self) -> None:
        with self._lock:
            self.expired = self.node is not None
        self._thaw()

    def _thaw(self) -> None:
        with self._lock:
            node, self.node = self.node, None
            if node is not None and self._run is not None:
                with contextlib.suppress(ProcessLookupError):
                    self._run.cluster.thaw(node)

    def teardown(self, run: Run) -> None:
        self.thaw()


class ThawBroker(Fault):
    """SIGCONT frozen brokers when ``trigger`` fires: what ``freeze`` (a FreezeBroker) froze
    (its ``says`` may use ``{expired}``: the freeze's timer had thawed it already), else
    ``broker``, else every frozen broker of the lab. They carry on where they stopped."""

    def __init__(self, trigger: Trigger, broker: Broker | None = None, *,
                 freeze: "FreezeBroker | None" = None, says: Says | None = None,
                 when: Callable[[Any], bool] | None = None, repeat: bool = False):
        self.trigger, self.broker, self.freeze = trigger, broker, freeze
        self.says, self.when, self.repeat = says, when, repeat
        self.name = "a frozen broker thawed"

    def invoke(self, run: Run) -> None:
        if self.freeze is not None:
            node, expired = self.freeze.node, self.freeze.stop_timer()
            self.freeze.thaw()
            if self.says is not None:
                run.fired(self, self.told(run, broker=node, expired=expired))
            return
        states = run.cluster.process_states()
        nodes = [_which(self.broker, run)] if self.broker is not None else \
            [n for n, state in states.items() if state == "frozen"]
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                run.cluster.thaw(node)
        run.fired(self, f"broker{'s' * (len(nodes) != 1)} {', '.join(map(str, nodes))} "
                        f"thawed ({self.trigger})")


class WholeLab(Fault):
    """No fault: before the clients, every broker of the lab running and every cut link
    forwarding (a run before may have left its old leader starting, or failed half way)."""

    name = "the lab made whole"

    def setup(self, run: Run) -> None:
        run.cluster.heal()
        run.cluster.restart()


class Isolate(Fault):
    """Cut broker ``broker`` off from the controller and its followers (a partitionable
    lab: ``labkit.faults.partition``) when ``trigger`` fires; clients still reach it. Healed
    at teardown, or by a ``Heal``."""

    def __init__(self, broker: Broker, trigger: Trigger):
        self.broker, self.trigger = broker, trigger
        self.name = "a broker cut off from the others"
        self.node: int | None = None

    def invoke(self, run: Run) -> None:
        self.node = _which(self.broker, run)
        run.cluster.isolate(self.node)
        run.fired(self, f"broker {self.node} cut off from the controller and its followers")

    def teardown(self, run: Run) -> None:
        run.cluster.heal()


class Heal(Fault):
    """Every cut link forwards again when ``trigger`` fires."""

    def __init__(self, trigger: Trigger):
        self.trigger = trigger
        self.name = "the network healed"

    def invoke(self, run: Run) -> None:
        run.cluster.heal()
        run.fired(self, "the cut links forward again")
