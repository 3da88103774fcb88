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
import dataclasses
import datetime
import functools
import itertools
import logging
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from labkit import settings

from labkit.kafka import protocol
from labkit.kafka.protocol import API_KEYS, API_NAMES, api_name
from labkit.kafka.reach import check_reachable

log = logging.getLogger(__name__)

LOCALHOST = "127.0.0.1"
STOP_TIMEOUT_S = 10.0
QUEUE_DEPTH = 64  # requests read ahead per connection while a delay holds them back
REFUSAL_WAIT_S = 0.5  # a refused Produce with no request behind it is answered after this

VALID_FAULT_FORMS: tuple[str, ...] = (
    "drop-ack:produce:N",
    "drop-response:<api>:N",
    "delay:<ms>",
    "delay:<ms>:<api>",
    "reset:<api>:N",
    "fail:produce:N",
)
_FORM_MEANINGS = (
    "the Nth Produce reaches the broker, its ack is dropped",
    "the same for any API",
    "hold every request back <ms> milliseconds",
    "hold every <api> request back <ms> milliseconds",
    "cut the connection when the Nth <api> request arrives",
    "the Nth Produce never reaches the broker: the proxy answers NOT_LEADER_OR_FOLLOWER "
    "once the request behind it is on its way",
)
_FORMS_HELP = "\n".join(f"  {form:<22}  {meaning}" for form, meaning in zip(VALID_FAULT_FORMS, _FORM_MEANINGS))


# --------------------------------------------------------------------------- fault specs


@dataclass(frozen=True)
class FaultSpec:
    """One network fault, as written on the command line (see VALID_FAULT_FORMS)."""

    kind: str  # 'drop-ack' | 'drop-response' | 'delay' | 'reset' | 'fail'
    api: str | None  # a Kafka API name: 'Produce', 'Fetch', 'OffsetCommit', 'EndTxn', ...
    nth: int = 1  # which request of that API, counted from when the fault is set
    ms: int = 0  # for delay


def api_key_of(api: str) -> int:
    """The api key of a Kafka API name, case-insensitive ('produce' -> 0)."""
    for name, key in API_KEYS.items():
        if name.lower() == api.strip().lower():
            return key
    raise ValueError(f"unknown Kafka API {api!r}; valid API names: {', '.join(sorted(API_KEYS))}")


def _canonical_api(api: str) -> str:
    return API_NAMES[api_key_of(api)]


def _fault_error(spec: str, why: str) -> ValueError:
    return ValueError(
        f"bad fault {spec!r}: {why}.\nValid forms:\n{_FORMS_HELP}\n"
        f"Valid API names (case-insensitive): {', '.join(sorted(API_KEYS))}"
    )


def _int(spec: str, text: str, what: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _fault_error(spec, f"{what} must be an integer, not {text!r}") from None
    if value < minimum:
        raise _fault_error(spec, f"{what} must be >= {minimum}, not {value}")
    return value


def parse_fault_spec(spec: str) -> FaultSpec:
    """'drop-ack:produce:2' -> FaultSpec('drop-ack', 'Produce', nth=2); ValueError on bad input."""
    parts = [p.strip() for p in str(spec).strip().split(":")]
    kind = parts[0].lower()
    if kind in ("drop-ack", "drop-response", "reset", "fail"):
        if len(parts) not in (2, 3) or not parts[1]:
            raise _fault_error(spec, f"{kind} needs an API name and optionally N")
        try:
            api = _canonical_api(parts[1])
        except ValueError:
            raise _fault_error(spec, f"unknown API {parts[1]!r}") from None
        if kind == "drop-ack" and api != "Produce":
            raise _fault_error(spec, "an ack is the response to a Produce; use drop-response:<api>:N")
        if kind == "fail" and api != "Produce":
            raise _fault_error(spec, "fail answers a Produce request; no other API")
        nth = _int(spec, parts[2], "N", 1) if len(parts) == 3 else 1
        return FaultSpec(kind, api, nth=nth)
    if kind == "delay":
        if len(parts) not in (2, 3):
            raise _fault_error(spec, "delay needs milliseconds and optionally an API name")
        ms = _int(spec, parts[1], "the delay in ms", 0)
        try:
            api = _canonical_api(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise _fault_error(spec, f"unknown API {parts[2]!r}") from None
        return FaultSpec("delay", api, ms=ms)
    raise _fault_error(spec, f"unknown fault kind {parts[0]!r}")


@dataclass
class _Rule:
    """An armed fault. api_key None matches every request."""

    kind: str  # 'drop' | 'reset' | 'delay' | 'fail'
    api_key: int | None
    nth: int = 1
    ms: int = 0
    jitter_ms: int = 0
    seen: int = 0

    def matches(self, api_key: int) -> bool:
        return self.api_key is None or self.api_key == api_key


# --------------------------------------------------------------------------- address rewriting


# Client-facing APIs whose responses name brokers (KRaft's Vote & co. name controllers and
# never pass a client proxy). Produce/Fetch/Share* carry KIP-951 leader hints after errors.
_ADDRESSED_APIS = frozenset(API_KEYS[n] for n in (
    "Metadata", "FindCoordinator", "DescribeCluster", "Produce", "Fetch", "ShareFetch",
    "ShareAcknowledge"))


@functools.lru_cache(maxsize=None)
def _address_fields(api_key: int, api_version: int) -> tuple[str, ...]:
    """Fields of a response body that carry broker addresses; () means forward it untouched."""
    if api_key not in _ADDRESSED_APIS:
        return ()
    try:
        names = set(load_response_schema(api_key, api_version).__dataclass_fields__)
    except Exception:  # a version kio does not know: nothing we could rewrite anyway
        return ()
    wanted = ("brokers", "coordinators", "node_endpoints", "host")
    return tuple(n for n in wanted if n in names)


def _moved(entry, port: int):
    return dataclasses.replace(entry, host=LOCALHOST, port=i32(port))


def _has_address(entry) -> bool:
    # FindCoordinator errors carry host '' and port -1: nothing to point anywhere.
    return bool(entry.host) and int(entry.port) >= 0


# --------------------------------------------------------------------------- the proxy


@dataclass
class _Link:
    """One client connection and its own connection to the broker behind it."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    queue: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(QUEUE_DEPTH))
    pending: collections.deque = field(default_factory=collections.deque)

    def close(self, reset: bool = False) -> None:
        """``reset``: the client sees a TCP RST. The broker side always gets an orderly
        close, so requests forwarded before the fault are still handled (an RST would
        discard whatever the broker had not read yet, e.g. pipelined acks=0 Produces)."""
        for writer in (self.client, self.upstream):
            if reset and writer is self.client:  # SO_LINGER 0: the peer sees an RST, not a FIN
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    except OSError:
                        pass
                writer.transport.abort()
            else:
                writer.close()


@dataclass
class _Refusal:
    """A Produce the proxy answers itself (``fail``), due once a request behind it is sent."""

    request: bytes
    response: bytes
    due: bool = False


class FaultProxy:
    """Listens on 127.0.0.1 (one port per broker) and forwards to ``upstream_bootstrap``."""

    def __init__(self, upstream_bootstrap: str, fault: FaultSpec | str | None = None,
                 seed: int = 0, trace: Callable[[dict], None] | None = None) -> None:
        """``trace`` is called with every request/response exchange as plain data
        (``protocol.describe_exchange`` plus ``ms``, the broker's answer time, and ``t``)."""
        self.upstream_bootstrap = upstream_bootstrap
        self._trace = trace
        self.bootstrap = ""
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._requests: collections.Counter[str] = collections.Counter()
        self._counts: collections.Counter[str] = collections.Counter()
        self._rewritten: collections.Counter[str] = collections.Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: dict[tuple[str, int], asyncio.Server] = {}  # upstream address -> listener
        self._ports: dict[tuple[str, int], int] = {}
        self._tasks: set[asyncio.Task] = set()
        self._security = protocol.Security()  # the upstream side's, read at start()
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
        addresses = [_split(brokers[node]) for node in sorted(brokers)]
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
        else:
            raise ValueError(f"unknown fault kind {spec.kind!r}; valid forms: {', '.join(VALID_FAULT_FORMS)}")

    def drop_response(self, api: str, nth: int = 1) -> None:
        """The Nth <api> request reaches the broker; its response is swallowed and that
        client connection closed: the write landed, the client never heard."""
        self._arm(_Rule("drop", api_key_of(api), nth=_positive(nth)))

    def delay(self, ms: int, api: str | None = None, jitter_ms: int = 0) -> None:
        """Hold each (<api>) request back ms + uniform(0, jitter_ms) milliseconds, in order."""
        if ms < 0 or jitter_ms < 0:
            raise ValueError(f"delay needs ms >= 0 and jitter_ms >= 0, not {ms} and {jitter_ms}")
        self._arm(_Rule("delay", api_key_of(api) if api else None, ms=ms, jitter_ms=jitter_ms))

    def reset(self, api: str | None = None, nth: int = 1) -> None:
        """Cut the client connection (TCP RST) when the Nth (<api>) request arrives, before
        it is forwarded: the broker never sees it."""
        self._arm(_Rule("reset", api_key_of(api) if api else None, nth=_positive(nth)))

    def fail_produce(self, nth: int = 1) -> None:
        """The Nth Produce request is not forwarded: the proxy answers it itself, every
        partition NOT_LEADER_OR_FOLLOWER (retriable), as a broker that just lost leadership
        would. The answer waits until the request behind it on that connection has gone to
        the broker, so a client that pipelines retries it *behind* a later batch."""
        self._arm(_Rule("fail", API_KEYS["Produce"], nth=_positive(nth)))

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
                "responses_rewritten": dict(self._rewritten),  # broker addresses replaced
                "responses_dropped": self._counts["responses_dropped"],
                "connections_reset": self._counts["connections_reset"],
                "requests_delayed": self._counts["requests_delayed"],
                "requests_failed": self._counts["requests_failed"],  # answered by the proxy
                "connections": self._counts["connections"],
                "protocol_errors": self._counts["protocol_errors"],  # should stay 0
            }

    def _arm(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _decide(self, api_key: int) -> tuple[str | None, float]:
        """(action, delay in s) for a request arriving now; one-shot rules fire on their Nth."""
        action, delay_ms = None, 0
        with self._lock:
            self._requests[api_name(api_key)] += 1
            for rule in list(self._rules):
                if not rule.matches(api_key):
                    continue
                if rule.kind == "delay":
                    delay_ms += rule.ms + (self._rng.randint(0, rule.jitter_ms) if rule.jitter_ms else 0)
                    continue
                rule.seen += 1
                if rule.seen == rule.nth and action != "reset":
                    action = rule.kind
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
                up_r, up_w = await self._open_upstream(upstream)
            except (OSError, asyncio.IncompleteReadError):  # broker down: the client sees a closed connection and retries
                client_w.close()
                return
            except protocol.ProtocolError as exc:  # refused credentials: say so, then close
                self._count("protocol_errors")
                log.error("fault proxy: %s", exc)
                client_w.close()
                return
            link = _Link(client_w, up_w)
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

    async def _open_upstream(self, upstream: tuple[str, int]):
        """A connection to the broker, secured as the lab's clients are (TLS, then SASL),
        before any of the client's frames go through it."""
        host, port = upstream
        context = self._security.ssl_context()
        reader, writer = await asyncio.open_connection(
            host, port, ssl=context, server_hostname=host if context else None)
        if not self._security.sasl:
            return reader, writer
        try:
            address, ids = f"{host}:{port}", itertools.count(1)
            steps = self._security.sasl_steps(address)
            request = next(steps)
            while True:
                correlation_id = next(ids)
                _write_frame(writer, protocol.encode_request(request, correlation_id))
                await writer.drain()
                payload = await _read_frame(reader)
                _, _, response = protocol.decode_response(
                    payload, int(request.__api_key__), int(request.__version__))
                try:
                    request = steps.send(response)
                except StopIteration:
                    return reader, writer
        except BaseException:
            writer.close()
            raise

    async def _read_requests(self, link: _Link, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        while True:
            payload = await _read_frame(reader)
            info = protocol.peek_request(payload)
            action, delay_s = self._decide(info.api_key)
            if action == "reset":
                self._count("connections_reset")
                # Forward what arrived before this request, then cut (in _send_requests).
                await link.queue.put((loop.time(), None, info, action))
                await asyncio.Future()  # read nothing more from this client
            await link.queue.put((loop.time() + delay_s, payload, info, action))

    async def _send_requests(self, link: _Link) -> None:
        """Forward in arrival order, each request no earlier than its due time."""
        loop = asyncio.get_running_loop()
        while True:
            due, payload, info, action = await link.queue.get()
            if action == "reset":
                link.close(reset=True)
                return
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            if action == "fail":
                self._count("requests_failed")
                refusal = _Refusal(payload, _refusal(payload))
                link.pending.append((info, "fail", refusal, time.time()))
                loop.call_later(REFUSAL_WAIT_S, self._release, link, refusal)  # none behind it
                continue
            answered = protocol.expects_response(payload)
            if answered:  # registered before sending, so the response always finds it
                link.pending.append((info, action, payload if self._trace else None, time.time()))
            elif self._trace:
                self._record(payload, None, time.time(), dropped=action == "drop")
            # A refusal waiting for a request behind it to be on its way: this one is. Answered
            # before this request's response can come back, so responses stay in order.
            for entry in link.pending:
                if entry[1] == "fail":
                    entry[2].due = True
            self._release(link)
            _write_frame(link.upstream, payload)
            await link.upstream.drain()
            if action == "drop" and not answered:
                # acks=0: there is no response to drop, so cutting the line is the fault.
                self._count("connections_reset")
                return

    async def _read_responses(self, link: _Link, reader: asyncio.StreamReader) -> None:
        while True:
            payload = await _read_frame(reader)
            correlation_id = protocol.peek_correlation_id(payload)
            if not link.pending:
                raise protocol.ProtocolError(f"unrequested response (correlation id {correlation_id})")
            info, action, request, sent = link.pending.popleft()
            if request is not None:
                self._record(request, payload, sent, dropped=action == "drop")
            if info.correlation_id != correlation_id:
                raise protocol.ProtocolError(
                    f"response for correlation id {correlation_id} where {info.correlation_id} "
                    f"({API_NAMES.get(info.api_key)}) was expected: the broker answers in order")
            if action == "drop":
                self._count("responses_dropped")
                return  # closing the link: the client never hears
            if _address_fields(info.api_key, info.api_version):
                payload = await self._rewrite(payload, info)
            _write_frame(link.client, payload)
            self._release(link)
            await link.client.drain()

    def _release(self, link: _Link, timed_out: "_Refusal | None" = None) -> None:
        """Answer the due refusals at the head of ``link.pending`` (in order: the client
        matches responses to requests by position). ``timed_out``: that one is due now."""
        if timed_out is not None:
            timed_out.due = True
        while link.pending and link.pending[0][1] == "fail" and link.pending[0][2].due:
            _, _, refusal, sent = link.pending.popleft()
            if self._trace:
                self._record(refusal.request, refusal.response, sent, dropped=False)
            if not link.client.is_closing():
                _write_frame(link.client, refusal.response)

    def _record(self, request: bytes, response: bytes | None, sent: float, dropped: bool) -> None:
        entry = protocol.describe_exchange(request, response)
        entry.update(ms=round((time.time() - sent) * 1000, 2), t=round(sent, 4))
        if dropped:
            entry["dropped"] = True
        try:
            self._trace(entry)
        except Exception as exc:  # a broken recorder must not break the client's traffic
            log.error("fault proxy: trace recorder failed: %s", exc)

    async def _rewrite(self, payload: bytes, info: protocol.RequestInfo) -> bytes:
        """Point every broker address in a response at the proxy; untouched bytes otherwise."""
        correlation_id, _, body = protocol.decode_response(payload, info.api_key, info.api_version)
        changes = {}
        for name in _address_fields(info.api_key, info.api_version):
            if name == "host":  # FindCoordinator v0-3: one coordinator, top-level fields
                if _has_address(body):
                    port = await self._local_port((body.host, int(body.port)))
                    changes.update(host=LOCALHOST, port=i32(port))
                continue
            entries = getattr(body, name)
            if entries:
                moved = []
                for entry in entries:
                    if _has_address(entry):
                        entry = _moved(entry, await self._local_port((entry.host, int(entry.port))))
                    moved.append(entry)
                changes[name] = tuple(moved)
        if not changes:
            return payload
        with self._lock:
            self._rewritten[API_NAMES[info.api_key]] += 1
        new_body = dataclasses.replace(body, **changes)
        return protocol.encode_response((correlation_id, new_body), info.api_key, info.api_version)


# --------------------------------------------------------------------------- helpers


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def _refusal(request: bytes) -> bytes:
    """The ProduceResponse a broker that is not the leader gives ``request``: each of its
    partitions NOT_LEADER_OR_FOLLOWER, nothing appended."""
    info = protocol.peek_request(request)
    _, body = protocol.decode_request(request)
    schema = load_response_schema(info.api_key, info.api_version)
    entities = __import__(schema.__module__, fromlist=["TopicProduceResponse"])

    def names(entity) -> set[str]:
        return {f.name for f in dataclasses.fields(entity)}

    partition_fields = names(entities.PartitionProduceResponse)
    topic_fields = names(entities.TopicProduceResponse)

    def refused(index) -> object:
        extra = {"record_errors": ()} if "record_errors" in partition_fields else {}
        return entities.PartitionProduceResponse(
            index=index, error_code=ErrorCode.not_leader_or_follower, base_offset=i64(-1), **extra)

    answer = schema(**{
        "responses": tuple(entities.TopicProduceResponse(
            **{k: getattr(t, k) for k in ("name", "topic_id") if k in topic_fields},
            partition_responses=tuple(refused(p.index) for p in t.partition_data))
            for t in body.topic_data),
        **({"throttle_time": datetime.timedelta(0)} if "throttle_time" in names(schema) else {})})
    return protocol.encode_response((info.correlation_id, answer), info.api_key, info.api_version)


def _write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.writelines((struct.pack(">i", len(payload)), payload))


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def _positive(nth: int) -> int:
    if int(nth) < 1:
        raise ValueError(f"nth counts requests from 1, not {nth}")
    return int(nth)
