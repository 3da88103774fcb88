"""Is a Kafka cluster there, and does it answer this client? ``check_reachable`` asks it for
metadata until it answers, and says why not in a ``ClusterError`` (``AuthenticationFailed``: it
answers but refuses this client's credentials, or their lack). Every kind of cluster, local or
external, is checked this way."""
from __future__ import annotations

import socket
import time

from confluent_kafka.admin import AdminClient

from labkit import settings

from labkit.kafka import secure as secure_lab
from labkit.kafka.clientlog import client_config
from labkit.paths import lab_home


class ClusterError(RuntimeError):
    """The cluster cannot do what was asked; the message says what to do instead."""


class AuthenticationFailed(ClusterError):
    """The cluster refused this client's credentials (or it sent none to a SASL_SSL port)."""


def check_reachable(bootstrap: str, timeout_s: float = 10.0, expect_brokers: int = 1,
                    identity: dict[str, str] | None = None) -> dict[int, str]:
    """Metadata from the cluster, or ClusterError saying it is not reachable
    (AuthenticationFailed: it answers but refuses this client's credentials, or lack of them).

    ``identity``: connection settings that replace LABKIT_KAFKA_CONFIG's (the lab's admin)."""
    refused: list[str] = []  # what librdkafka said about authentication, from its error_cb

    def on_error(err) -> None:
        if secure_lab.looks_like_auth_failure(f"{err.name()} {err.str()}"):
            refused.append(err.str())

    admin = AdminClient(client_config({"bootstrap.servers": bootstrap,
                                       "socket.connection.setup.timeout.ms": 2000,
                                       "error_cb": on_error, **(identity or {}),
                                       "log_level": 0}))  # connection-refused noise while it starts
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        admin.poll(0)  # serves error_cb
        if refused:  # credentials do not heal by waiting: say so at once
            raise AuthenticationFailed(f"{secure_lab.auth_message(lab_home())} (Kafka at {bootstrap}: "
                                       f"{refused[-1]})")
        try:
            md = admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            brokers = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
            if len(brokers) >= expect_brokers and md.controller_id >= 0:
                return brokers
        except Exception as exc:  # KafkaException while it is still coming up
            last_error = exc
        time.sleep(0.2)
    if (identity is None and settings.current().kafka_config is None
            and accepts_connections(bootstrap)):
        # It takes connections but never answers a plaintext client without credentials:
        # most likely a TLS/SASL listener (librdkafka only says "transport failure").
        raise AuthenticationFailed(
            f"{secure_lab.auth_message(lab_home())} (Kafka at {bootstrap} accepts connections "
            "but answers no plaintext client without credentials)")
    raise ClusterError(
        f"Kafka at {bootstrap} is not reachable (no metadata within {timeout_s:.0f} s"
        f"{': ' + str(last_error) if last_error else ''}). Check the address and that the "
        "broker runs; unset LABKIT_BOOTSTRAP to use a local lab broker instead."
    )


def accepts_connections(bootstrap: str) -> bool:
    """Whether the first address of ``bootstrap`` takes a TCP connection (within 2 s)."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False
