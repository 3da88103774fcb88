"""A Kafka-protocol-aware TCP proxy that injects network faults between clients and brokers.

    with FaultProxy(cluster.bootstrap, "drop-ack:produce:3") as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, ...})
        ...                       # the 3rd Produce lands in the log, its ack never arrives
        proxy.stats()             # {'requests': {'Produce': 7, ...}, 'responses_dropped': 1, ...}

One listening port on 127.0.0.1 per upstream broker. Frames pass through unchanged except
the responses that carry broker addresses (Metadata, FindCoordinator, DescribeCluster and the
KIP-951 leader hints in Produce/Fetch), which are rewritten to the proxy's own ports so no
client connection ever goes around it. Responses are matched to requests by correlation id
(the broker answers in order per connection); an acks=0 Produce has no response.

Faults are counted from the moment they are set, over all connections; drop and reset fire
once (on the Nth matching request), delay lasts until ``clear()``.

Against a cluster that wants TLS and credentials (``LABKIT_KAFKA_CONFIG``) only the upstream
side is secure: each upstream connection does TLS and authenticates itself (SASL, as the
lab's own clients would) before it relays the client's frames. The client side stays
plaintext on 127.0.0.1, and the proxy says so (``settings.mark_plaintext``): a lab client
pointed at ``proxy.bootstrap``, in this process or a worker started while the proxy runs,
gets no security settings from ``labkit.kafka.clientlog.client_config``.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random
import threading
import time
from collections.abc import Callable

from labkit import settings

from labkit.faults.faultspec import VALID_FAULT_FORMS, FaultSpec, Rule, api_key_of, parse_fault_spec, positive
from labkit.faults.wire import (LOCALHOST, Link, Refusal, address_fields, not_leader_answer, open_upstream, read_frame,
                                with_error,
                                rewrite_addresses, split_address, write_frame)
from labkit.kafka import exchanges, protocol
from labkit.kafka.protocol import API_KEYS, API_NAMES, api_name
from labkit.kafka.reach import check_reachable

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0
REFUSAL_WAIT_S = 0.5  # a refused Produce with no request behind it is answered after this


class FaultProxy:
    """Listens on 127.0.0.1 (one port per broker) and forwards to ``upstream_bootstrap``."""

    def __init__(self, upstream_bootstrap: str, fault: FaultSpec | str | None = None,
                 seed: int = 0, trace: Callable[[dict], None] | None = None,
                 trace_apis: set[str] | None = None,
                 killer: Callable[[int, str], None] | None = None) -> None:
        """``trace`` is called with every request/response exchange as plain data
        (``exchanges.describe_exchange`` plus ``ms``, the broker's answer time, and ``t``);
        ``trace_apis``: only those APIs' exchanges (decoding every Fetch costs a loaded
        machine dearly). ``killer(port, api)`` SIGKILLs the process whose connection comes from
        that local port (it sent an ``api`` request), for ``kill:<api>:N``."""
        self.upstream_bootstrap = upstream_bootstrap
        self._trace = trace
        self._traced = None if trace_apis is None else {api_key_of(a) for a in trace_apis}
        self.killer = killer
        self.bootstrap = ""
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._requests: collections.Counter[str] = collections.Counter()
        self._bytes: dict[str, collections.Counter[str]] = {  # frame bytes per API, each way
            "request_bytes": collections.Counter(), "response_bytes": collections.Counter()}
        self._counts: collections.Counter[str] = collections.Counter()
        self._rewritten: collections.Counter[str] = collections.Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: dict[tuple[str, int], asyncio.Server] = {}  # upstream address -> listener
        self._ports: dict[tuple[str, int], int] = {}
        self._tasks: set[asyncio.Task] = set()
        self._security = protocol.Security()  # the upstream side's, read at start()
        self._released = threading.Event()  # a held connection goes on (release_held)
        self._holding = False  # a hold rule fired and was not released yet
        self._late: list[tuple[tuple[str, int], bytes]] = []  # (broker, request): faults/late.py
        if fault is not None:
            self.apply(fault)

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> "FaultProxy":
        if self._loop is not None:
            return self
        brokers = check_reachable(self.upstream_bootstrap)  # clear error if it is not there
        self._security = protocol.Security.for_address(self.upstream_bootstrap)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"labkit-fault-proxy->{self.upstream_bootstrap}")
        self._thread.start()
        addresses = [split_address(brokers[node]) for node in sorted(brokers)]
        try:
            ports = self._run(self._listen_all(addresses))
        except BaseException:
            self.stop()
            raise
        self.bootstrap = ",".join(f"{LOCALHOST}:{p}" for p in ports)
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None:
            return
        try:
            if loop.is_running():
                self._run(self._shutdown())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(STOP_TIMEOUT_S)
            loop.close()
            self._loop = self._thread = None
            self._servers.clear()
            # Its ports are free again: whatever listens there next is not the proxy.
            settings.unmark_plaintext(",".join(f"{LOCALHOST}:{p}" for p in self._ports.values()))
            self._ports.clear()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(STOP_TIMEOUT_S)

    # -- faults -----------------------------------------------------------------
    def apply(self, fault: FaultSpec | str) -> None:
        """Arm a parsed (or textual) fault spec."""
        spec = parse_fault_spec(fault) if isinstance(fault, str) else fault
        if spec.kind in ("drop-ack", "drop-response"):
            self.drop_response(spec.api or "", spec.nth)
        elif spec.kind == "delay":
            self.delay(spec.ms, spec.api)
        elif spec.kind == "reset":
            self.reset(spec.api, spec.nth)
        elif spec.kind == "fail":
            self.fail_produce(spec.nth)
        elif spec.kind == "error":
            self.answer_error(spec.api or "", spec.nth, spec.error)
        elif spec.kind == "kill":
            self.kill_sender(spec.api or "", spec.nth)
        else:
            raise ValueError(f"unknown fault kind {spec.kind!r}; valid forms: {', '.join(VALID_FAULT_FORMS)}")

    def answer_error(self, api: str, nth: int, error: str) -> None:
        """The ``nth`` ``api`` request reaches the broker, and its answer reaches the client
        with ``error`` in every error code (what a fenced member or a refused record gets)."""
        self._arm(Rule("error", api_key_of(api), positive(nth), error=error))

    def kill_sender(self, api: str, nth: int = 1) -> None:
        """The Nth <api> request is not forwarded: the process that sent it is SIGKILLed
        (``killer``), then its connection cut. Whatever it sent before on that connection
        reaches the broker first. kill:endtxn:1 is a crash at the first commit_transaction()
        once its records are all written: the transaction stays open, its records in the log."""
        if self.killer is None:
            raise ValueError(f"kill:{api}:{nth} needs a run whose processes the lab supervises "
                             "(the proxy cannot tell which process to kill)")
        self._arm(Rule("kill", api_key_of(api), nth=positive(nth)))

    def drop_response(self, api: str, nth: int = 1) -> None:
        """The Nth <api> request reaches the broker; its response is swallowed and that
        client connection closed: the write landed, the client never heard."""
        self._arm(Rule("drop", api_key_of(api), nth=positive(nth)))

    def delay(self, ms: int, api: str | None = None, jitter_ms: int = 0) -> None:
        """Hold each (<api>) request back ms + uniform(0, jitter_ms) milliseconds, in order."""
        if ms < 0 or jitter_ms < 0:
            raise ValueError(f"delay needs ms >= 0 and jitter_ms >= 0, not {ms} and {jitter_ms}")
        self._arm(Rule("delay", api_key_of(api) if api else None, ms=ms, jitter_ms=jitter_ms))

    def reset(self, api: str | None = None, nth: int = 1) -> None:
        """Cut the client connection (TCP RST) when the Nth (<api>) request arrives, before
        it is forwarded: the broker never sees it."""
        self._arm(Rule("reset", api_key_of(api) if api else None, nth=positive(nth)))

    def fail_produce(self, nth: int = 1) -> None:
        """The Nth Produce request is not forwarded: the proxy answers it itself, every
        partition NOT_LEADER_OR_FOLLOWER (retriable), as a broker that just lost leadership
        would. The answer waits until the request behind it on that connection has gone to
        the broker, so a client that pipelines retries it *behind* a later batch."""
        self._arm(Rule("fail", API_KEYS["Produce"], nth=positive(nth)))

    def hold(self, api: str, nth: int = 1) -> None:
        """From the Nth <api> request on, every request through the proxy (on any client
        connection, new ones included) is held before the broker until ``release_held()``:
        the proxy's clients cut off from the brokers, their requests sent and never arriving,
        without a reset (a client that times a request out and reconnects is held again)."""
        self._released.clear()
        self._arm(Rule("hold", api_key_of(api), nth=positive(nth)))

    def release_held(self) -> None:
        """Forward what ``hold`` held, in order per connection (the cut heals)."""
        self._holding = False
        self._released.set()

    def clear(self) -> None:
        """Disarm every fault; traffic flows untouched again."""
        with self._lock:
            self._rules.clear()

    def stats(self) -> dict:
        """Requests seen per API name, responses dropped, connections reset, requests delayed,
        client connections accepted and protocol errors (responses that matched no request)."""
        with self._lock:
            return {
                "requests": dict(self._requests),
                **{way: dict(counts) for way, counts in self._bytes.items()},
                "responses_rewritten": dict(self._rewritten),  # broker addresses replaced
                "responses_dropped": self._counts["responses_dropped"],
                "responses_errored": self._counts["responses_errored"],  # error:<api>:N:<ERROR>
                "connections_reset": self._counts["connections_reset"],
                "requests_delayed": self._counts["requests_delayed"],
                "requests_failed": self._counts["requests_failed"],  # answered by the proxy
                "requests_held": self._counts["requests_held"],
                "senders_killed": self._counts["senders_killed"],  # kill:<api>:N
                "connections": self._counts["connections"],
                "protocol_errors": self._counts["protocol_errors"],  # should stay 0
            }

    def _arm(self, rule: Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _decide(self, api_key: int, size: int = 0) -> tuple[str | None, float]:
        """(action, delay in s) for a request of ``size`` bytes arriving now; one-shot rules
        fire on their Nth."""
        action, delay_ms = None, 0
        with self._lock:
            self._requests[api_name(api_key)] += 1
            self._bytes["request_bytes"][api_name(api_key)] += size
            for rule in list(self._rules):
                if not rule.matches(api_key):
                    continue
                if rule.kind == "delay":
                    delay_ms += rule.ms + (self._rng.randint(0, rule.jitter_ms) if rule.jitter_ms else 0)
                    continue
                rule.seen += 1
                if rule.seen == rule.nth and action != "reset":
                    action = f"error:{rule.error}" if rule.kind == "error" else rule.kind
                    self._rules.remove(rule)
            if delay_ms:
                self._counts["requests_delayed"] += 1
        return action, delay_ms / 1000

    def _count(self, what: str) -> None:
        with self._lock:
            self._counts[what] += 1

    # -- listeners (all below runs on the proxy's event loop) ---------------------
    async def _listen_all(self, addresses: list[tuple[str, int]]) -> list[int]:
        return [await self._local_port(address) for address in addresses]

    async def _local_port(self, upstream: tuple[str, int]) -> int:
        """The proxy port standing in for a broker address; opened on first sight."""
        if upstream not in self._ports:
            server = await asyncio.start_server(
                functools.partial(self._serve, upstream), LOCALHOST, 0)
            self._servers[upstream] = server
            self._ports[upstream] = port = server.sockets[0].getsockname()[1]
            # Before any client can hear of it: this address speaks plaintext.
            settings.mark_plaintext(f"{LOCALHOST}:{port}")
        return self._ports[upstream]

    async def _shutdown(self) -> None:
        for server in self._servers.values():
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers.values():
            await server.wait_closed()

    # -- one client connection ------------------------------------------------------
    async def _serve(self, upstream: tuple[str, int], client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        self._tasks.add(me)
        self._count("connections")
        try:
            try:
                up_r, up_w = await open_upstream(upstream, self._security)
            except (OSError, asyncio.IncompleteReadError):  # broker down: the client sees a closed connection and retries
                client_w.close()
                return
            except protocol.ProtocolError as exc:  # refused credentials: say so, then close
                self._count("protocol_errors")
                log.error("fault proxy: %s", exc)
                client_w.close()
                return
            link = Link(client_w, up_w)
            pumps = [asyncio.create_task(self._read_requests(link, client_r)),
                     asyncio.create_task(self._send_requests(link)),
                     asyncio.create_task(self._read_responses(link, up_r))]
            try:
                done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if not task.cancelled() and isinstance(task.exception(), protocol.ProtocolError):
                        self._count("protocol_errors")
                        log.error("fault proxy: %s", task.exception())
            finally:
                for task in pumps:
                    task.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
                link.close()
        except asyncio.CancelledError:
            pass  # stop(): asyncio's server callback would log a cancelled task as an error
        finally:
            self._tasks.discard(me)

    async def _read_requests(self, link: Link, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        while True:
            payload = await read_frame(reader)
            info = protocol.peek_request(payload)
            action, delay_s = self._decide(info.api_key, len(payload) + 4)  # + the size field
            if action in ("reset", "kill"):
                self._count("connections_reset" if action == "reset" else "senders_killed")
                # Forward what arrived before this request, then cut (in _send_requests).
                await link.queue.put((loop.time(), None, info, action))
                await asyncio.Future()  # read nothing more from this client
            await link.queue.put((loop.time() + delay_s, payload, info, action))

    async def _send_requests(self, link: Link) -> None:
        """Forward in arrival order, each request no earlier than its due time."""
        loop = asyncio.get_running_loop()
        while True:
            due, payload, info, action = await link.queue.get()
            if action == "kill":  # its sender dies before anything else can reach the broker
                port = link.client.get_extra_info("peername")[1]
                await loop.run_in_executor(None, self.killer, port, api_name(info.api_key))
            if action in ("reset", "kill"):
                link.close(reset=True)
                return
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            if action == "late":  # kept for faults/late.py to deliver; its connection stalls
                self._late.append((link.upstream.get_extra_info("peername")[:2], payload))
                self._count("requests_held")
                await asyncio.Future()  # until its client times out and closes the connection
            if action == "hold":
                self._holding = not self._released.is_set()
            if self._holding:
                self._count("requests_held")
                while not self._released.is_set():  # the requests behind it queue up
                    await asyncio.sleep(0.05)
            if action == "fail":
                self._count("requests_failed")
                refusal = Refusal(payload, not_leader_answer(payload))
                link.pending.append((info, "fail", refusal, time.time()))
                loop.call_later(REFUSAL_WAIT_S, self._release, link, refusal)  # none behind it
                continue
            answered = protocol.expects_response(payload)
            traced = self._traces(info.api_key)
            if answered:  # registered before sending, so the response always finds it
                link.pending.append((info, action, payload if traced else None, time.time()))
            elif traced:
                self._record(payload, None, time.time(), dropped=action == "drop")
            # A refusal waiting for a request behind it to be on its way: this one is. Answered
            # before this request's response can come back, so responses stay in order.
            for entry in link.pending:
                if entry[1] == "fail":
                    entry[2].due = True
            self._release(link)
            write_frame(link.upstream, payload)
            await link.upstream.drain()
            if action == "drop" and not answered:
                # acks=0: there is no response to drop, so cutting the line is the fault.
                self._count("connections_reset")
                return

    async def _read_responses(self, link: Link, reader: asyncio.StreamReader) -> None:
        while True:
            payload = await read_frame(reader)
            correlation_id = protocol.peek_correlation_id(payload)
            if not link.pending:
                raise protocol.ProtocolError(f"unrequested response (correlation id {correlation_id})")
            info, action, request, sent = link.pending.popleft()
            with self._lock:
                self._bytes["response_bytes"][api_name(info.api_key)] += len(payload) + 4
            if info.correlation_id != correlation_id:
                raise protocol.ProtocolError(
                    f"response for correlation id {correlation_id} where {info.correlation_id} "
                    f"({API_NAMES.get(info.api_key)}) was expected: the broker answers in order")
            forged = action is not None and action.startswith("error:")
            if forged:  # recorded as the client reads it: the history says what it was told
                payload = with_error(payload, info, action.removeprefix("error:"))
                self._count("responses_errored")
            if request is not None:
                self._record(request, payload, sent, dropped=action == "drop", forged=forged)
            if action == "drop":
                self._count("responses_dropped")
                return  # closing the link: the client never hears
            if address_fields(info.api_key, info.api_version):
                payload = await self._rewrite(payload, info)
            write_frame(link.client, payload)
            self._release(link)
            await link.client.drain()

    def _release(self, link: Link, timed_out: "Refusal | None" = None) -> None:
        """Answer the due refusals at the head of ``link.pending`` (in order: the client
        matches responses to requests by position). ``timed_out``: that one is due now."""
        if timed_out is not None:
            timed_out.due = True
        while link.pending and link.pending[0][1] == "fail" and link.pending[0][2].due:
            info, _, refusal, sent = link.pending.popleft()
            if self._traces(info.api_key):
                self._record(refusal.request, refusal.response, sent, dropped=False,
                             forged=True)  # the proxy's answer: the broker never saw it
            if not link.client.is_closing():
                write_frame(link.client, refusal.response)

    def _traces(self, api_key: int) -> bool:
        return self._trace is not None and (self._traced is None or api_key in self._traced)

    def _record(self, request: bytes, response: bytes | None, sent: float, dropped: bool,
                forged: bool = False) -> None:
        entry = exchanges.describe_exchange(request, response)
        entry.update(ms=round((time.time() - sent) * 1000, 2), t=round(sent, 4))
        if dropped:
            entry["dropped"] = True
        if forged:  # the error is the proxy's, not the broker's
            entry["forged"] = True
        try:
            self._trace(entry)
        except Exception as exc:  # a broken recorder must not break the client's traffic
            log.error("fault proxy: trace recorder failed: %s", exc)

    async def _rewrite(self, payload: bytes, info: protocol.RequestInfo) -> bytes:
        """Point every broker address in a response at the proxy; untouched bytes otherwise."""
        rewritten = await rewrite_addresses(payload, info, self._local_port)
        if rewritten is None:
            return payload
        with self._lock:
            self._rewritten[API_NAMES[info.api_key]] += 1
        return rewritten
