"""The Kafka wire as the fault proxy handles it: its connection to a broker (secured as the
lab's clients are), length-prefixed frames, the broker addresses in responses that it points
at itself, and the Produce refusal it answers on a broker's behalf (``fail``). Decoding and
encoding the messages is ``labkit.kafka.protocol``'s."""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import functools
import itertools
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from labkit.kafka import protocol
from labkit.kafka.protocol import API_KEYS

LOCALHOST = "127.0.0.1"
QUEUE_DEPTH = 64  # requests read ahead per connection while a delay holds them back


@dataclass
class Link:
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
class Refusal:
    """A Produce the proxy answers itself (``fail``), due once a request behind it is sent."""

    request: bytes
    response: bytes
    due: bool = False


# Client-facing APIs whose responses name brokers (KRaft's Vote & co. name controllers and
# never pass a client proxy). Produce/Fetch/Share* carry KIP-951 leader hints after errors.
_ADDRESSED_APIS = frozenset(API_KEYS[n] for n in (
    "Metadata", "FindCoordinator", "DescribeCluster", "Produce", "Fetch", "ShareFetch",
    "ShareAcknowledge"))


@functools.lru_cache(maxsize=None)
def address_fields(api_key: int, api_version: int) -> tuple[str, ...]:
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


async def rewrite_addresses(payload: bytes, info: protocol.RequestInfo,
                            local_port: Callable[[tuple[str, int]], Awaitable[int]]) -> bytes | None:
    """``payload`` (a response) with every broker address in it pointed at the proxy port
    ``local_port`` gives for that address; None if it named no broker (forward it as it is)."""
    correlation_id, _, body = protocol.decode_response(payload, info.api_key, info.api_version)
    changes = {}
    for name in address_fields(info.api_key, info.api_version):
        if name == "host":  # FindCoordinator v0-3: one coordinator, top-level fields
            if _has_address(body):
                port = await local_port((body.host, int(body.port)))
                changes.update(host=LOCALHOST, port=i32(port))
            continue
        entries = getattr(body, name)
        if entries:
            moved = []
            for entry in entries:
                if _has_address(entry):
                    entry = _moved(entry, await local_port((entry.host, int(entry.port))))
                moved.append(entry)
            changes[name] = tuple(moved)
    if not changes:
        return None
    new_body = dataclasses.replace(body, **changes)
    return protocol.encode_response((correlation_id, new_body), info.api_key, info.api_version)


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def not_leader_answer(request: bytes) -> bytes:
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


def with_error(response: bytes, info: protocol.RequestInfo, error: str) -> bytes:
    """``response`` with every ``error_code`` in it (top level and nested: each partition's)
    set to the error named ``error``: what the broker would answer a fenced member, a
    refused record. The rest is as the broker answered."""
    correlation_id, _, body = protocol.decode_response(response, info.api_key, info.api_version)
    code = ErrorCode[error.lower()]

    def changed(node):
        if isinstance(node, tuple):
            return tuple(changed(n) for n in node)
        if not dataclasses.is_dataclass(node):
            return node
        updates = {f.name: changed(getattr(node, f.name)) for f in dataclasses.fields(node)}
        if isinstance(updates.get("error_code"), ErrorCode):
            updates["error_code"] = code
        return dataclasses.replace(node, **updates)

    return protocol.encode_response((correlation_id, changed(body)), info.api_key,
                                    info.api_version)


def write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.writelines((struct.pack(">i", len(payload)), payload))


def split_address(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


async def open_upstream(upstream: tuple[str, int], security: protocol.Security
                        ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the broker, secured as the lab's clients are (TLS, then SASL),
    before any of the client's frames go through it."""
    host, port = upstream
    context = security.ssl_context()
    reader, writer = await asyncio.open_connection(
        host, port, ssl=context, server_hostname=host if context else None)
    if not security.sasl:
        return reader, writer
    try:
        address, ids = f"{host}:{port}", itertools.count(1)
        steps = security.sasl_steps(address)
        request = next(steps)
        while True:
            correlation_id = next(ids)
            write_frame(writer, protocol.encode_request(request, correlation_id))
            await writer.drain()
            payload = await read_frame(reader)
            _, _, response = protocol.decode_response(
                payload, int(request.__api_key__), int(request.__version__))
            try:
                request = steps.send(response)
            except StopIteration:
                return reader, writer
    except BaseException:
        writer.close()
        raise
