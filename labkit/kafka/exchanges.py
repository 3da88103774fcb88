"""A protocol trace: each request and its response through the fault proxy as plain data
(the API, its version, the first error code anywhere in the answer, the producer id, epoch
and transactional id it carries), for experiments that read what the clients and brokers
said to each other."""
from __future__ import annotations

import dataclasses

from kio.schema.errors import ErrorCode

from labkit.kafka.protocol import api_name, decode_request, decode_response, peek_request


def first_error(entity) -> str | None:
    """The name of the first non-zero error code anywhere in a request or response entity
    (``error_code``, ``partition_error_code``, ...: top level first, then nested results),
    None when every one is NONE."""
    pending = [entity]
    while pending:
        node = pending.pop(0)
        if isinstance(node, (list, tuple)):
            pending.extend(node)
        elif dataclasses.is_dataclass(node):
            values = [getattr(node, f.name) for f in dataclasses.fields(node)]
            for code in values:
                if isinstance(code, ErrorCode) and code.value != 0:
                    return code.name.upper()
            pending.extend(v for v in values if not isinstance(v, ErrorCode))
    return None


def describe_exchange(request: bytes, response: bytes | None) -> dict:
    """One request and its response as plain data, for a protocol trace: API name and
    version, client id, correlation id, the first error code, and the producer id/epoch
    where the request or response carries them (transactions, idempotence)."""
    info = peek_request(request)
    out = {"api": api_name(info.api_key), "version": info.api_version, "client_id": None,
           "correlation_id": info.correlation_id, "error": None}
    try:
        header, body = decode_request(request)
        out["client_id"] = header.client_id
        answer = decode_response(response, info.api_key, info.api_version)[2] if response else None
    except Exception:  # a version kio cannot read: the name and numbers above still stand
        return out
    for entity in (body, answer):
        for name in ("producer_id", "producer_epoch", "transactional_id"):
            value = _field(entity, name)
            if value is not None:
                out[name] = int(value) if name != "transactional_id" else value
    if _field(body, "producer_id") is not None:  # -1 in an InitProducerId: a new one
        out["request_producer_id"] = int(_field(body, "producer_id"))
    out["error"] = first_error(answer) if answer is not None else None
    return out


def _field(entity, name: str):
    """A field of a request or response (AddPartitionsToTxn up to v3 names its fields
    ``v3_and_below_<name>``)."""
    value = getattr(entity, name, None)
    return getattr(entity, f"v3_and_below_{name}", None) if value is None else value


def errors_answered(trace: list[dict], api: str) -> list[str]:
    """Each error the ``api`` requests of a trace (``describe_exchange`` entries) were
    answered with, once, sorted."""
    return sorted({e["error"] for e in trace if e["api"] == api and e["error"]})
