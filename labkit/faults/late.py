"""A late request: one request taken off the wire and delivered after its client gave up.

    fault = LateRequest("EndTxn", on("txn2-written"))   # the first EndTxn is kept
    ...   # the client times the request out, reconnects, retries, goes on
    fault.exchange    # when the trigger fired, the kept request reached the broker:
                      # {'api': 'EndTxn', 'error': 'PRODUCER_FENCED', 'late': True, ...}

What Jepsen's analysis of Kafka's transaction protocol (2024, KAFKA-17754) needs: a request
delayed in the network long enough that its client timed it out and moved on, then
delivered. The proxy keeps the Nth request of an API and stalls the connection it came on
(as a stuck TCP stream would: nothing behind it arrives, no reset), so the client's own
request timeout is what ends the wait. When the client closes that connection the kept
request stays with the proxy; ``deliver`` sends it to the same broker on a connection of its
own and reads the broker's answer, which no client hears. The broker does not tie producer
or transaction state to a connection, so to it this is the same late request.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from labkit.faults.faultspec import Rule, api_key_of, positive
from labkit.faults.nemesis import Fault, Run, Trigger
from labkit.faults.proxy import FaultProxy
from labkit.faults.wire import open_upstream, read_frame, write_frame
from labkit.faults.wire_faults import stop_proxy
from labkit.kafka import exchanges

DELIVER_TIMEOUT_S = 30.0  # the broker answers a Produce or an EndTxn in milliseconds


class LateProxy(FaultProxy):
    """The lab's fault proxy, able to keep one request for later (``keep``, ``deliver``)."""

    def keep(self, api: str, nth: int = 1) -> None:
        """The Nth ``api`` request from now is kept, not forwarded, and its connection
        stalled: its client hears nothing until it gives up on it."""
        self._kept_at: list[float] = getattr(self, "_kept_at", [])  # when each was kept
        self._arm(Rule("late", api_key_of(api), nth=positive(nth)))

    @property
    def kept(self) -> int:
        """How many kept requests wait for ``deliver``."""
        return len(self._late)

    def deliver(self) -> dict:
        """Send the oldest kept request to its broker now; its exchange as plain data
        (``labkit.kafka.exchanges``) with ``late: True``, ``request`` (its bytes, for a
        reader of its record batches) and ``kept_s``. ValueError if none was kept."""
        if not self._late:
            raise ValueError("no request was kept: the client never sent the one to hold "
                             f"(requests seen: {self.stats()['requests']})")
        (address, payload), since = self._late.pop(0), self._kept_at.pop(0)
        future = asyncio.run_coroutine_threadsafe(self._deliver(address, payload), self._loop)
        response, sent = future.result(DELIVER_TIMEOUT_S)
        entry = exchanges.describe_exchange(payload, response)
        entry.update(late=True, ms=round((time.time() - sent) * 1000, 2), t=round(sent, 4),
                     kept_s=round(sent - since, 2))
        if self._trace is not None:
            self._trace(entry)
        return {**entry, "request": payload}

    def _decide(self, api_key: int, size: int = 0) -> tuple[str | None, float]:
        action, delay_s = super()._decide(api_key, size)
        if action == "late":  # when it was kept: how late it is when delivered
            self._kept_at.append(time.time())
        return action, delay_s

    async def _deliver(self, address: tuple[str, int], payload: bytes) -> tuple[bytes, float]:
        reader, writer = await open_upstream(address, self._security)
        try:
            sent = time.time()
            write_frame(writer, payload)
            await writer.drain()
            return await read_frame(reader), sent
        finally:
            writer.close()


class LateRequest(Fault):
    """The run's clients talk through a ``LateProxy`` that keeps the ``nth`` ``api`` request
    from the start; when ``trigger`` fires it is delivered (``exchange``: the broker's answer,
    also in the run's facts as ``late_exchange``). Every exchange of ``trace_apis`` is kept
    in ``exchanges``."""

    def __init__(self, api: str, trigger: Trigger, nth: int = 1,
                 trace_apis: set[str] | None = None):
        api_key_of(api)  # an unknown API is refused here, listing the valid ones
        self.api, self.nth, self.trigger = api, positive(nth), trigger
        self.trace_apis = trace_apis
        self.name = f"{api} #{nth} delivered late"
        self.exchanges: list[dict] = []
        self.exchange: dict | None = None
        self.proxy: LateProxy | None = None

    def setup(self, run: Run) -> None:
        self.proxy = LateProxy(run.bootstrap, trace=self.exchanges.append,
                               trace_apis=self.trace_apis)
        self.proxy.keep(self.api, self.nth)
        self.proxy.start()
        run.client_bootstrap = self.proxy.bootstrap

    def invoke(self, run: Run) -> None:
        self.exchange = self.proxy.deliver()
        answer = self.exchange["error"] or "no error"
        run.observe(late_exchange={k: v for k, v in self.exchange.items() if k != "request"})
        run.fired(self, f"the {self.api} kept {self.exchange['kept_s']:.1f} s reaches the "
                        f"broker: answered {answer}")

    def teardown(self, run: Any) -> None:
        self.proxy = stop_proxy(self.proxy, run)
