"""Kafka Connect's REST API, the calls the lab makes (the worker: ``labkit.kafka.connect``).

    rest = ConnectRest("http://127.0.0.1:28083")
    rest.create("outbox", {"connector.class": ..., ...})   # PUT /connectors/outbox/config
    rest.wait_running("outbox")                            # connector and tasks RUNNING
    rest.offsets("outbox")      # what Connect keeps for it (KIP-875), e.g. Debezium's LSN

Plain ``urllib``: a handful of JSON calls to a server on loopback. A refusal from Connect
(a config it rejects, a connector that failed) is a ``ConnectError`` carrying Connect's
own message (and a failed task's first trace lines).
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

RUNNING_TIMEOUT_S = 60.0


class ConnectError(RuntimeError):
    """Connect refused a request, or a worker or connector failed; the message says why.
    ``status``: the HTTP status Connect answered with (None: no answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ConnectRest:
    def __init__(self, url: str, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request; its JSON answer (None for an empty one)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json",
                                                  "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as refused:
            detail = refused.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("message", detail)
            except (ValueError, AttributeError):
                pass
            raise ConnectError(f"{method} {path}: Connect answered {refused.code}: {detail}",
                               refused.code) from None
        except (urllib.error.URLError, OSError) as unreachable:
            raise ConnectError(f"{method} {path}: no Connect worker answers at {self.url} "
                               f"({unreachable}); is it running?") from None
        return json.loads(text) if text.strip() else None

    # -- the worker ---------------------------------------------------------------------
    def healthy(self) -> bool:
        """Has the worker started (joined its group, read its config topic)? GET /health
        (KIP-1017) answers 503 until then; False while nothing listens yet."""
        try:
            return (self.call("GET", "/health") or {}).get("status") == "healthy"
        except ConnectError:
            return False

    def plugins(self) -> list[str]:
        """The connector classes the worker found on its plugin.path and classpath."""
        return [p["class"] for p in self.call("GET", "/connector-plugins")]

    # -- connectors ---------------------------------------------------------------------
    def connectors(self) -> list[str]:
        return self.call("GET", "/connectors")

    def create(self, name: str, config: dict[str, Any]) -> dict:
        """Create connector ``name`` (or change its config): PUT /connectors/{name}/config.
        A config Connect rejects raises ConnectError listing each setting's errors."""
        config = {k: str(v) for k, v in config.items()}
        try:
            return self.call("PUT", f"/connectors/{name}/config", config)
        except ConnectError as refused:
            # Connect 4.4 answers an invalid Debezium config with a 500 (a NullPointerException
            # in AbstractHerder.maybeAddConfigErrors: Debezium's validation lists settings
            # without values), not with the errors: ask for them.
            errors = self.validate({**config, "name": name}) if refused.status == 500 else {}
            if not errors:
                raise
            raise ConnectError(f"Connect refuses connector {name!r}: " + "; ".join(
                f"{key}: {' '.join(why)}" for key, why in errors.items()), 400) from None

    def validate(self, config: dict[str, Any]) -> dict[str, list[str]]:
        """The errors Connect finds in a connector config, per setting (none: {}):
        PUT /connector-plugins/{class}/config/validate."""
        found = self.call("PUT", f"/connector-plugins/{config['connector.class']}/config/validate",
                          {k: str(v) for k, v in config.items()})
        return {c["value"]["name"]: c["value"]["errors"] for c in found.get("configs", [])
                if (c.get("value") or {}).get("errors")}

    def config(self, name: str) -> dict[str, str]:
        return self.call("GET", f"/connectors/{name}/config")

    def status(self, name: str) -> dict:
        """``{"connector": {"state": ...}, "tasks": [{"id": 0, "state": ..., "trace"?}]}``."""
        return self.call("GET", f"/connectors/{name}/status")

    def wait_running(self, name: str, timeout_s: float = RUNNING_TIMEOUT_S) -> dict:
        """Until the connector and at least one task are RUNNING (its status); a FAILED one
        raises with its trace's first lines."""
        deadline = time.monotonic() + timeout_s
        last: dict = {}
        while True:
            try:
                last = self.status(name)
            except ConnectError:  # 404 until the connector's config has been read back
                last = {}
            states = [last.get("connector", {}).get("state")] + [t.get("state") for t in last.get("tasks", [])]
            for part in [last.get("connector", {}), *last.get("tasks", [])]:
                if part.get("state") == "FAILED":
                    trace = "\n".join((part.get("trace") or "").splitlines()[:6])
                    raise ConnectError(f"connector {name!r} failed:\n{trace}")
            if len(states) > 1 and all(s == "RUNNING" for s in states):
                return last
            if time.monotonic() > deadline:
                raise ConnectError(f"connector {name!r} was not running within {timeout_s:.0f} s: "
                                   f"{last or 'no status yet'}")
            time.sleep(0.25)

    def offsets(self, name: str) -> list[dict]:
        """The source offsets Connect keeps for ``name`` (GET /connectors/{name}/offsets,
        KIP-875): ``[{"partition": {...}, "offset": {...}}]``, as its tasks last committed."""
        return (self.call("GET", f"/connectors/{name}/offsets") or {}).get("offsets", [])

    def stop(self, name: str) -> None:
        """PUT /connectors/{name}/stop: its tasks stop (writing their last offsets)."""
        self.call("PUT", f"/connectors/{name}/stop")

    def resume(self, name: str) -> None:
        """PUT /connectors/{name}/resume: a stopped (or paused) connector runs again, from
        the offsets its tasks wrote when they stopped."""
        self.call("PUT", f"/connectors/{name}/resume")

    def delete(self, name: str) -> None:
        self.call("DELETE", f"/connectors/{name}")
