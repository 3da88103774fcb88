"""Kafka's wire protocol, just enough to talk to a broker directly (kio has the types).

Used by the inspector (to see what client libraries hide: record batches, markers,
producer state) and by the fault proxy (to know which request a response answers).

Against a cluster that wants TLS and credentials (``LABKIT_KAFKA_CONFIG``), ``Security``
says how to connect: a TLS context and the SASL exchange (SaslHandshake, then
SaslAuthenticate rounds: PLAIN, SCRAM-SHA-256/512 through ``scramp``), written once as a
generator so the blocking ``Connection`` and the proxy's asyncio upstream drive the same steps.

A frame on the wire is ``int32 size`` + ``header`` + ``body``. Requests carry header v1
(non-flexible API versions) or v2 (flexible, with tagged fields); responses carry header v0
or v1 likewise, except ApiVersions responses, which always use v0.
"""
from __future__ import annotations

import io
import itertools
import socket
import ssl
import struct
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path

from kio.index import load_request_schema, load_response_schema
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

API_VERSIONS_KEY = 18
CLIENT_ID = "labkit"


class ProtocolError(RuntimeError):
    pass


class AuthenticationError(ProtocolError):
    """The broker refused the lab's credentials (or mechanism); the message says what to set."""


@dataclass(frozen=True)
class RequestInfo:
    """What a proxy needs to know about a request to match its response."""

    api_key: int
    api_version: int
    correlation_id: int


# 'Produce', 'Fetch', 'OffsetCommit', ...: the names of Kafka's protocol docs, by api key.
API_KEYS: dict[str, int] = {
    "".join(word.capitalize() for word in snake.split("_")): key for key, snake in api_key_map.items()
}
API_NAMES: dict[int, str] = {key: name for name, key in API_KEYS.items()}


def api_name(api_key: int) -> str:
    """'Produce' for 0, 'Fetch' for 1, ... (the names Kafka's docs use)."""
    return API_NAMES.get(api_key, f"api-{api_key}")


def request_flexible(api_key: int, api_version: int) -> bool:
    return bool(load_request_schema(api_key, api_version).__flexible__)


def response_header_type(api_key: int, api_version: int):
    if api_key == API_VERSIONS_KEY:
        return ResponseHeaderV0
    return ResponseHeaderV1 if request_flexible(api_key, api_version) else ResponseHeaderV0


# ---------------------------------------------------------------- frames


def read_exact(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed by peer")
        chunks += chunk
    return bytes(chunks)


def read_frame(sock: socket.socket) -> bytes:
    """One size-prefixed frame, without its size prefix."""
    (size,) = struct.unpack(">i", read_exact(sock, 4))
    return read_exact(sock, size)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def peek_request(payload: bytes) -> RequestInfo:
    """api key, version and correlation id: the first 8 bytes of every request header."""
    api_key, api_version, correlation_id = struct.unpack(">hhi", payload[:8])
    return RequestInfo(api_key, api_version, correlation_id)


def peek_correlation_id(response_payload: bytes) -> int:
    return struct.unpack(">i", response_payload[:4])[0]


PRODUCE_KEY = 0
FIRST_FLEXIBLE_PRODUCE = 9


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def produce_acks(payload: bytes) -> int:
    """The acks of a Produce request, read without decoding its records.

    A proxy needs it because the broker never answers an acks=0 Produce: waiting for that
    response would misalign every later response on the connection.
    """
    info = peek_request(payload)
    flexible = info.api_version >= FIRST_FLEXIBLE_PRODUCE
    (client_id_len,) = struct.unpack_from(">h", payload, 8)
    pos = 10 + max(client_id_len, 0)
    if flexible:  # request header v2: tagged fields after client_id
        count, pos = _uvarint(payload, pos)
        for _ in range(count):
            _, pos = _uvarint(payload, pos)
            size, pos = _uvarint(payload, pos)
            pos += size
    if info.api_version >= 3:  # transactional_id comes before acks
        if flexible:
            n, pos = _uvarint(payload, pos)
            pos += max(n - 1, 0)
        else:
            (n,) = struct.unpack_from(">h", payload, pos)
            pos += 2 + max(n, 0)
    return struct.unpack_from(">h", payload, pos)[0]


def expects_response(payload: bytes) -> bool:
    """False only for a Produce with acks=0, the one request Kafka never answers."""
    return peek_request(payload).api_key != PRODUCE_KEY or produce_acks(payload) != 0


def encode_request(request, correlation_id: int, client_id: str = CLIENT_ID) -> bytes:
    """Header + body of a request entity (a kio request dataclass), without size prefix."""
    key, version = int(request.__api_key__), int(request.__version__)
    header_type = RequestHeaderV2 if request.__flexible__ else RequestHeaderV1
    header = header_type(request_api_key=i16(key), request_api_version=i16(version),
                         correlation_id=i32(correlation_id), client_id=client_id)
    buf = io.BytesIO()
    entity_writer(header_type)(buf, header)
    entity_writer(type(request))(buf, request)
    return buf.getvalue()


def decode_response(payload: bytes, api_key: int, api_version: int):
    """(correlation_id, header size, kio response entity) of a response payload."""
    header_type = response_header_type(api_key, api_version)
    header, header_size = entity_reader(header_type)(payload, 0)
    body_type = load_response_schema(api_key, api_version)
    body, _ = entity_reader(body_type)(payload, header_size)
    return int(header.correlation_id), header_size, body


def decode_request(payload: bytes):
    """(kio request header, kio request entity) of a request payload."""
    info = peek_request(payload)
    header_type = RequestHeaderV2 if request_flexible(info.api_key, info.api_version) else RequestHeaderV1
    header, header_size = entity_reader(header_type)(payload, 0)
    body, _ = entity_reader(load_request_schema(info.api_key, info.api_version))(payload, header_size)
    return header, body


def encode_response(header_and_body: tuple[int, object], api_key: int, api_version: int) -> bytes:
    """Re-encode a (correlation_id, response entity) pair, e.g. after rewriting addresses."""
    correlation_id, body = header_and_body
    header_type = response_header_type(api_key, api_version)
    buf = io.BytesIO()
    entity_writer(header_type)(buf, header_type(correlation_id=i32(correlation_id)))
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


# ---------------------------------------------------------------- security: TLS and SASL

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_FIX = ("set LABKIT_KAFKA_CONFIG=<path> to the cluster's client.properties "
        "(`labkit up --secure` wrote one in the lab home)")


@dataclass(frozen=True)
class Security:
    """How to reach one address: TLS or not, SASL or not (librdkafka's property names in,
    see ``from_properties``). ``Security()`` is plaintext without credentials."""

    protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    mechanism: str = ""  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    username: str = ""
    password: str = ""
    ca_location: str = ""  # a PEM file of CA certificates ("" and no ca_pem: the system's)
    ca_pem: str = ""
    certificate_location: str = ""  # a client certificate (mutual TLS), with its key
    key_location: str = ""
    key_password: str = ""
    verify: bool = True  # enable.ssl.certificate.verification
    check_hostname: bool = True  # ssl.endpoint.identification.algorithm=https (the default)

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> "Security":
        """From a checked client.properties (``labkit.kafka.connection.settings()``)."""
        protocol = props.get("security.protocol", "PLAINTEXT").upper()
        mechanism = (props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "").upper()
        if protocol.startswith("SASL") and mechanism not in SASL_MECHANISMS:
            raise ProtocolError(f"sasl.mechanism={mechanism}: the lab's own protocol connection "
                                f"(inspector, fault proxy) speaks {', '.join(SASL_MECHANISMS)}")
        return cls(protocol=protocol, mechanism=mechanism,
                   username=props.get("sasl.username", ""),
                   password=props.get("sasl.password", ""),
                   ca_location=props.get("ssl.ca.location", ""),
                   ca_pem=props.get("ssl.ca.pem", ""),
                   certificate_location=props.get("ssl.certificate.location", ""),
                   key_location=props.get("ssl.key.location", ""),
                   key_password=props.get("ssl.key.password", ""),
                   verify=props.get("enable.ssl.certificate.verification", "true").lower()
                   != "false",
                   check_hostname=props.get("ssl.endpoint.identification.algorithm",
                                            "https").lower() == "https")

    @classmethod
    def for_address(cls, bootstrap: str) -> "Security":
        """What every lab client of ``bootstrap`` uses (LABKIT_KAFKA_CONFIG; plaintext for a
        fault proxy's own addresses): the one rule of ``labkit.kafka.connection.for_client``."""
        from labkit.kafka import connection

        return cls.from_properties(connection.for_client(bootstrap))

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context (None without TLS): the CA file, the hostname check."""
        if not self.tls:
            return None
        context = ssl.create_default_context(
            cafile=str(Path(self.ca_location).expanduser()) if self.ca_location else None,
            cadata=self.ca_pem or None)
        if self.certificate_location:
            context.load_cert_chain(str(Path(self.certificate_location).expanduser()),
                                    str(Path(self.key_location).expanduser())
                                    if self.key_location else None,
                                    self.key_password or None)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif not self.check_hostname:
            context.check_hostname = False
        return context

    def sasl_steps(self, address: str) -> Generator[object, object, None]:
        """The SASL exchange as requests to send: yields a kio request, receives its decoded
        response; ends when the broker has accepted the credentials (and, for SCRAM, proved
        it knows them too). Raises AuthenticationError naming the fix."""
        handshake = yield SaslHandshakeRequest(mechanism=self.mechanism)
        if handshake.error_code != ErrorCode.none:
            offered = ", ".join(handshake.mechanisms) or "none"
            raise AuthenticationError(
                f"authentication failed at {address}: the broker does not accept "
                f"sasl.mechanism={self.mechanism} (it offers {offered}); {_FIX}")
        if self.mechanism == "PLAIN":
            token = f"\0{self.username}\0{self.password}".encode()
            _accepted((yield SaslAuthenticateRequest(auth_bytes=token)), address)
            return
        from scramp import ScramClient, ScramException

        scram = ScramClient([self.mechanism], self.username, self.password)
        first = yield SaslAuthenticateRequest(auth_bytes=scram.get_client_first().encode())
        try:
            scram.set_server_first(_accepted(first, address).decode())
            final = yield SaslAuthenticateRequest(auth_bytes=scram.get_client_final().encode())
            scram.set_server_final(_accepted(final, address).decode())
        except ScramException as exc:
            raise AuthenticationError(f"authentication failed at {address}: {exc}; {_FIX}") from None


def _accepted(response, address: str) -> bytes:
    if response.error_code != ErrorCode.none:
        why = response.error_message or response.error_code.name
        raise AuthenticationError(f"authentication failed at {address}: {why}; {_FIX}")
    return response.auth_bytes


def authenticate(security: Security, address: str, round_trip: Callable[[object], object]) -> None:
    """Drive ``security``'s SASL exchange over ``round_trip`` (request -> decoded response)."""
    steps = security.sasl_steps(address)
    request = next(steps)
    while True:
        try:
            request = steps.send(round_trip(request))
        except StopIteration:
            return


# ---------------------------------------------------------------- a tiny blocking client


class Connection:
    """One connection to one broker; ``send(request)`` returns the decoded response.

    The first request asks the broker which versions it speaks (ApiVersions), so a request
    the broker cannot read fails with a clear message instead of a closed socket.

    ``security`` defaults to what every lab client of ``address`` uses
    (``Security.for_address``: LABKIT_KAFKA_CONFIG): TLS is set up and SASL done here, before
    the first request.
    """

    def __init__(self, address: str, timeout_s: float = 10.0, security: Security | None = None):
        host, port = address.rsplit(":", 1)
        self.address = address
        self.security = Security.for_address(address) if security is None else security
        self._ids = itertools.count(1)
        self._versions: dict[int, tuple[int, int]] | None = None
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        try:
            context = self.security.ssl_context()
            if context is not None:
                self.sock = context.wrap_socket(self.sock, server_hostname=host.strip("[]"))
            if self.security.sasl:
                authenticate(self.security, address, self._round_trip)
        except BaseException:
            self.sock.close()
            raise

    def supported_versions(self) -> dict[int, tuple[int, int]]:
        """api key -> (lowest, highest) version the broker speaks."""
        if self._versions is None:
            try:
                response = self._round_trip(ApiVersionsRequest(client_software_name=CLIENT_ID,
                                                               client_software_version="1"))
            except (OSError, ProtocolError) as exc:  # closed, or a TLS alert read as a frame
                if self.security.protocol != "PLAINTEXT":
                    raise
                # A TLS or SASL listener drops a plaintext client at its first request.
                raise ConnectionError(
                    f"{self.address} closed the connection at the first request ({exc}): if "
                    f"the cluster wants TLS or credentials, {_FIX}") from None
            if response.error_code != ErrorCode.none:
                raise ProtocolError(f"{self.address} refused ApiVersions: {response.error_code.name}")
            self._versions = {int(k.api_key): (int(k.min_version), int(k.max_version))
                              for k in response.api_keys}
        return self._versions

    def send(self, request):
        api_key, version = int(request.__api_key__), int(request.__version__)
        low, high = self.supported_versions().get(api_key, (None, None))
        if low is None or not low <= version <= high:
            speaks = "does not speak it" if low is None else f"speaks v{low} to v{high}"
            raise ProtocolError(
                f"labkit sends {api_name(api_key)} v{version}, but the broker at {self.address} "
                f"{speaks}; point LABKIT_BOOTSTRAP at a newer Apache Kafka (the lab runs 4.x)")
        return self._round_trip(request)

    def _round_trip(self, request):
        correlation_id = next(self._ids)
        self.sock.sendall(frame(encode_request(request, correlation_id)))
        payload = read_frame(self.sock)
        got, _, body = decode_response(payload, int(request.__api_key__), int(request.__version__))
        if got != correlation_id:
            raise ProtocolError(f"expected correlation id {correlation_id}, got {got}")
        return body

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
