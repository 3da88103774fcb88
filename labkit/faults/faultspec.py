"""Network faults as written on the command line (``drop-ack:produce:3``, ``delay:250``, ...):
their forms, parsing with an error that lists the valid ones, and a fault once it is armed in
``labkit.faults.proxy.FaultProxy`` (a ``Rule``: which requests it matches and how many it has
seen)."""
from __future__ import annotations

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from labkit.kafka.protocol import API_KEYS, API_NAMES


VALID_FAULT_FORMS: tuple[str, ...] = (
    "drop-ack:produce:N",
    "drop-response:<api>:N",
    "delay:<ms>",
    "delay:<ms>:<api>",
    "reset:<api>:N",
    "fail:produce:N",
    "error:<api>:N:<ERROR>",
    "kill:<api>:N",
)
_FORM_MEANINGS = (
    "the Nth Produce reaches the broker, its ack is dropped",
    "the same for any API",
    "hold every request back <ms> milliseconds",
    "hold every <api> request back <ms> milliseconds",
    "cut the connection when the Nth <api> request arrives",
    "the Nth Produce never reaches the broker: the proxy answers NOT_LEADER_OR_FOLLOWER "
    "once the request behind it is on its way",
    "the Nth <api> request reaches the broker; its answer comes back with <ERROR> in every "
    "error code (e.g. error:txnoffsetcommit:1:ILLEGAL_GENERATION)",
    "the Nth <api> request never reaches the broker: the process that sent it is SIGKILLed "
    "(supervised runs only; kill:endtxn:1: a crash as the first commit_transaction() is sent, "
    "its transaction's records all written)",
)
_FORMS_HELP = "\n".join(f"  {form:<22}  {meaning}" for form, meaning in zip(VALID_FAULT_FORMS, _FORM_MEANINGS))


@dataclass(frozen=True)
class FaultSpec:
    """One network fault, as written on the command line (see VALID_FAULT_FORMS)."""

    kind: str  # 'drop-ack' | 'drop-response' | 'delay' | 'reset' | 'fail' | 'error' | 'kill'
    api: str | None  # a Kafka API name: 'Produce', 'Fetch', 'OffsetCommit', 'EndTxn', ...
    nth: int = 1  # which request of that API, counted from when the fault is set
    ms: int = 0  # for delay
    # for error: the error code's name, e.g. 'ILLEGAL_GENERATION' (out of the repr, which
    # notebooks print for the other kinds)
    error: str = field(default="", repr=False)


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
    if kind in ("drop-ack", "drop-response", "reset", "fail", "kill"):
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
    if kind == "error":
        if len(parts) != 4 or not parts[1]:
            raise _fault_error(spec, "error needs an API name, N and an error name")
        try:
            api = _canonical_api(parts[1])
        except ValueError:
            raise _fault_error(spec, f"unknown API {parts[1]!r}") from None
        nth = _int(spec, parts[2], "N", 1)
        return FaultSpec("error", api, nth=nth, error=error_code_of(spec, parts[3]).name.upper())
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


def error_code_of(spec: str, name: str) -> ErrorCode:
    """Kafka's error code named ``name`` (case-insensitive), refused with the known names."""
    try:
        return ErrorCode[name.strip().lower()]
    except KeyError:
        known = ", ".join(sorted(e.name.upper() for e in ErrorCode if e.value > 0))
        raise _fault_error(spec, f"unknown error {name!r}; Kafka's error names: {known}") from None


@dataclass
class Rule:
    """An armed fault. api_key None matches every request."""

    kind: str  # 'drop' | 'reset' | 'delay' | 'fail' | 'hold' | 'error' | 'kill' | 'late'
    api_key: int | None
    nth: int = 1
    ms: int = 0
    error: str = ""  # for 'error': the code every error field of the answer gets
    jitter_ms: int = 0
    seen: int = 0

    def matches(self, api_key: int) -> bool:
        return self.api_key is None or self.api_key == api_key


def positive(nth: int) -> int:
    if int(nth) < 1:
        raise ValueError(f"nth counts requests from 1, not {nth}")
    return int(nth)
