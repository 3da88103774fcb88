"""Faults on the wire: the lab's Kafka-protocol-aware proxy (``labkit.faults.proxy``)
between the clients and the cluster, a fault armed in it from the start or when a trigger
fires (a lost ack, a reset, a delay, a request answered with an error).

    Nemesis(ProxyFault("drop-ack:produce:1"))                  # from the start
    Nemesis(ProxyFault("drop-ack:produce:1", on("batch-sent", batch=3)))
    Nemesis(ProxyFault(trace=exchanges.append))                # every exchange recorded
    Nemesis(ProxyFault(("drop-ack:produce:1", "delay:4000:produce")))   # two at once

    Nemesis(HoldRequests("EndTxn", on("before-commit", batch=2), until=aborted))

While it is set up the run's ``client_bootstrap`` is the proxy's, so every client the
experiment starts afterwards talks through it; the lab's own reads (the audit) go to the
cluster directly. Its counters end up in the run's facts as ``fault_stats``.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from labkit.checking import history
from labkit.faults.faultspec import api_key_of, parse_fault_spec
from labkit.faults.nemesis import Fault, Run, Says, Trigger, Until
from labkit.faults.proxy import FaultProxy

CHECK_EVERY_S = 0.1  # how often a hold's ``until`` is asked (it may read the cluster)


class Arm(Fault):
    """A fault armed in the run's fault proxy (a ``ProxyFault`` set up before it) when its
    trigger fires, or when a ``Schedule`` says: e.g. ``Arm("error:txnoffsetcommit:1:
    ILLEGAL_GENERATION")``, the next offsets sent to a transaction refused as a fenced
    member's. Several faults armed at once are joined by "+"."""

    def __init__(self, spec: str, trigger: Trigger | None = None, name: str = ""):
        self.specs = spec.split("+")
        for one in self.specs:
            parse_fault_spec(one)  # a bad form is refused here, listing the valid ones
        self.spec = spec
        self.trigger = trigger or Trigger()
        self.name = name or spec

    def invoke(self, run: Run) -> None:
        proxies = [f for f in run.nemesis.of(ProxyFault) if f.proxy is not None]
        if not proxies:
            raise ValueError(f"{self.spec}: no fault proxy in this run (add ProxyFault())")
        for one in self.specs:
            proxies[0].proxy.apply(one)
        run.fired(self, f"{self.name} armed in the proxy")


class ProxyFault(Fault):
    """``spec`` (a ``labkit.faults.faultspec`` form; several as a tuple or joined by "+";
    None: the proxy only) armed from the start, or when ``trigger`` fires; each exchange
    handed to ``trace``, kept in ``exchanges`` (``keep=True``), with ``trace_file``
    written there as a JSON line, and with ``to_history`` appended to the run's history as a
    ``wire`` entry, for its checkers (``trace_apis``: only those APIs' exchanges). ``only_if(run)``:
    whether the run needs the proxy at all (a plaintext app in front of a cluster that wants
    TLS or credentials). ``kill:<api>:N`` SIGKILLs the run's supervised instance that sent
    that request (``run.workers``)."""

    def __init__(self, spec: str | Sequence[str] | None = None, trigger: Trigger | None = None,
                 trace: Callable[[dict], None] | None = None, trace_file: str | None = None,
                 keep: bool = False, only_if: Callable[[Run], bool] | None = None,
                 trace_apis: set[str] | None = None, to_history: bool = False):
        given = () if spec is None else spec.split("+") if isinstance(spec, str) else spec
        self.specs = tuple(given)
        for one in self.specs:
            parse_fault_spec(one)  # a bad form is refused here, listing the valid ones
        self.spec = ", ".join(self.specs) or None
        self.trace, self.trace_file, self.to_history = trace, trace_file, to_history
        self._history: str | None = None
        self.trace_apis = trace_apis  # only these APIs' exchanges (None: all)
        self._out = None
        self.exchanges: list[dict] | None = [] if keep else None
        self.from_start = trigger is None
        self.only_if = only_if  # set up only where the run needs it (None: always)
        if trigger is not None:
            self.trigger = trigger
        self.name = self.spec or "the fault proxy"
        self.proxy: FaultProxy | None = None

    def setup(self, run: Run) -> None:
        if self.only_if is not None and not self.only_if(run):
            return
        if self.trace_file is not None:
            self._out = open(self.trace_file, "w", encoding="utf-8")
        if self.to_history:
            self._history = str(run.history_file)
        self.proxy = FaultProxy(run.bootstrap, trace=self._record, trace_apis=self.trace_apis,
                                killer=lambda port, api: self._kill(run, port, api))
        if self.from_start:
            self._arm()
        self.proxy.start()
        run.client_bootstrap = self.proxy.bootstrap

    def invoke(self, run: Run) -> None:
        if self.specs and self.proxy is not None:
            self._arm()
            run.fired(self, f"{self.spec} armed in the proxy")

    def _arm(self) -> None:
        for one in self.specs:
            self.proxy.apply(one)

    def _kill(self, run: Run, port: int, api: str) -> None:
        """kill:<api>:N: the supervised instance whose connection comes from ``port``."""
        workers = getattr(run, "workers", None)
        instance = workers.instance_on_port(port) if workers is not None else None
        if instance is not None and workers.kill(instance):
            run.fired(self, f"instance {instance} SIGKILLed as it sent {api}")

    def _record(self, exchange: dict) -> None:
        if self.exchanges is not None:
            self.exchanges.append(exchange)
        if self.trace is not None:
            self.trace(exchange)
        if self._out is not None:
            self._out.write(json.dumps(exchange) + "\n")
        if self._history is not None:  # the exchange's own time, not the append's
            history.append(self._history, "wire", **exchange)

    def teardown(self, run: Run) -> None:
        self.proxy = stop_proxy(self.proxy, run)
        if self._out is not None:
            self._out.close()
            self._out = None


class HoldRequests(ProxyFault):
    """A client cut off from the cluster without a reset: from the first ``api`` request
    after ``trigger`` fires, every request through the proxy (new connections' too) is held
    before the brokers, sent and never arriving, until ``until`` holds (asked from the
    nemesis's thread: the client may be blocked in the held call), ``release()``, or
    teardown. Just before it lets them go it reports the event ``releasing`` (``api``):
    what fires on it sees the system as the hold left it. ``held_s``: how long it held;
    ``until`` not holding within its timeout releases them and fails the run."""

    def __init__(self, api: str, trigger: Trigger, until: Until | None = None,
                 says: Says | None = None, released: Says | None = None):
        api_key_of(api)  # an unknown API is refused here, listing the valid ones
        super().__init__(None, trigger)
        self.api, self.until, self.says, self.released = api, until, says, released
        self.name = f"{api} requests held"
        self.held_s: float | None = None
        self._since: float | None = None
        self._asked = 0.0

    @property
    def holding(self) -> bool:
        return self._since is not None

    def invoke(self, run: Run) -> None:
        self.proxy.hold(self.api)
        self._since = time.monotonic()
        run.fired(self, self.told(run, f"{self.api} and every request after it held "
                                       f"({self.trigger})", api=self.api))

    def poll(self, run: Run, now_s: float) -> None:
        if self._since is None or self.until is None or now_s - self._asked < CHECK_EVERY_S:
            return
        self._asked = now_s
        if self.until.holds(run):
            self.held_s = time.monotonic() - self._since
            self.release(run)
        elif time.monotonic() - self._since > self.until.timeout_s:
            self.release(run)
            raise TimeoutError(f"waited {self.until.timeout_s:.0f} s for {self.until.what}")

    def release(self, run: Any, told: bool = True) -> None:
        """Let the held requests go, in order per connection (the cut heals); ``told``:
        report ``releasing`` first and say so on the timeline."""
        if self._since is None:
            return
        if told:
            run.event("releasing", api=self.api)
        self._since = None
        self.proxy.release_held()
        if told and self.released is not None:
            run.fired(self, self.told(run, template=self.released, api=self.api))

    def teardown(self, run: Run) -> None:
        if self.proxy is not None:
            self.release(run, told=False)  # the run is over: nothing more to observe
        super().teardown(run)


def stop_proxy(proxy: FaultProxy | None, run: Run) -> None:
    """A fault's proxy stopped, its counts kept in the run's facts, and the clients sent to
    the broker itself again; returns None (the fault holds no proxy any more)."""
    if proxy is not None:
        run.observe(fault_stats=proxy.stats())
        proxy.stop()
        run.client_bootstrap = run.bootstrap
    return None
