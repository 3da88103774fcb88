"""Faults on the wire: the lab's Kafka-protocol-aware proxy (``labkit.faults.proxy``)
between the clients and the cluster, a fault armed in it from the start or when a trigger
fires (a lost ack, a reset, a delay, a request answered with an error).

    Nemesis(ProxyFault("drop-ack:produce:1"))                  # from the start
    Nemesis(ProxyFault("drop-ack:produce:1", on("batch-sent", batch=3)))
    Nemesis(ProxyFault(trace=exchanges.append))                # every exchange recorded

While it is set up the run's ``client_bootstrap`` is the proxy's, so every client the
experiment starts afterwards talks through it; the lab's own reads (the audit) go to the
cluster directly. Its counters end up in the run's facts as ``fault_stats``.
"""
from __future__ import annotations

import json
from collections.abc import Callable

from labkit.faults.faultspec import parse_fault_spec
from labkit.faults.nemesis import Fault, Run, Trigger
from labkit.faults.proxy import FaultProxy


class Arm(Fault):
    """A fault armed in the run's fault proxy (a ``ProxyFault`` set up before it) when its
    trigger fires, or when a ``Schedule`` says: e.g. ``Arm("error:txnoffsetcommit:1:
    ILLEGAL_GENERATION")``, the next offsets sent to a transaction refused as a fenced
    member's."""

    def __init__(self, spec: str, trigger: Trigger | None = None, name: str = ""):
        parse_fault_spec(spec)
        self.spec = spec
        self.trigger = trigger or Trigger()
        self.name = name or spec

    def invoke(self, run: Run) -> None:
        proxies = [f for f in run.nemesis.of(ProxyFault) if f.proxy is not None]
        if not proxies:
            raise ValueError(f"{self.spec}: no fault proxy in this run (add ProxyFault())")
        proxies[0].proxy.apply(self.spec)
        run.fired(self, f"{self.name} armed in the proxy")


class ProxyFault(Fault):
    """``spec`` (a ``labkit.faults.faultspec`` form, or None: the proxy only) armed from the
    start, or when ``trigger`` fires; each exchange handed to ``trace``, kept in
    ``exchanges`` (``keep=True``) and, with ``trace_file``, written there as a JSON line.
    ``only_if(run)``: whether the run needs the proxy at all (a plaintext app in front of a
    cluster that wants TLS or credentials). ``kill:<api>:N`` SIGKILLs the run's supervised
    instance that sent that request (``run.workers``)."""

    def __init__(self, spec: str | None = None, trigger: Trigger | None = None,
                 trace: Callable[[dict], None] | None = None, trace_file: str | None = None,
                 keep: bool = False, only_if: Callable[[Run], bool] | None = None,
                 trace_apis: set[str] | None = None):
        for one in (spec or "").split("+") if spec else ():  # "a+b": both armed
            parse_fault_spec(one)  # a bad form is refused here, listing the valid ones
        self.spec, self.trace, self.trace_file = spec, trace, trace_file
        self.trace_apis = trace_apis  # only these APIs' exchanges (None: all)
        self._out = None
        self.exchanges: list[dict] | None = [] if keep else None
        self.from_start = trigger is None
        self.only_if = only_if  # set up only where the run needs it (None: always)
        if trigger is not None:
            self.trigger = trigger
        self.name = spec or "the fault proxy"
        self.proxy: FaultProxy | None = None

    def setup(self, run: Run) -> None:
        if self.only_if is not None and not self.only_if(run):
            return
        if self.trace_file is not None:
            self._out = open(self.trace_file, "w", encoding="utf-8")
        self.proxy = FaultProxy(run.bootstrap, trace=self._record, trace_apis=self.trace_apis,
                                killer=lambda port, api: self._kill(run, port, api)).start()
        if self.spec is not None and self.from_start:
            for one in self.spec.split("+"):
                self.proxy.apply(one)
        run.client_bootstrap = self.proxy.bootstrap

    def invoke(self, run: Run) -> None:
        if self.spec is not None and self.proxy is not None:
            for one in self.spec.split("+"):
                self.proxy.apply(one)
            run.fired(self, f"{self.spec} armed in the proxy")

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

    def teardown(self, run: Run) -> None:
        if self.proxy is not None:
            run.facts["fault_stats"] = self.proxy.stats()
            self.proxy.stop()
            self.proxy = None
            run.client_bootstrap = run.bootstrap
        if self._out is not None:
            self._out.close()
            self._out = None
