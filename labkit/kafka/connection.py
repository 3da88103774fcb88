"""How the lab's clients reach a cluster that wants credentials: ``LABKIT_KAFKA_CONFIG``.

``LABKIT_KAFKA_CONFIG=path/to/client.properties`` names a properties file in librdkafka's
property names (what a managed Kafka service hands out, and what ``labkit up --secure``
writes)::

    security.protocol=SASL_SSL
    sasl.mechanism=SCRAM-SHA-512
    sasl.username=learner
    sasl.password=...
    ssl.ca.location=/path/to/ca.pem

``settings()`` reads it (each call, so a changed file or variable is seen at once) and
checks every name, so a typo or a Java client's name (``sasl.jaas.config``,
``ssl.truststore.location``) is a clear error here instead of a client that silently
connects without credentials. ``labkit.kafka.clientlog.client_config`` merges the result into
every Python client the lab makes; the Java and Spark sides translate the same dict.
"""
from __future__ import annotations

import os
from pathlib import Path

from labkit import settings as lab_settings

# The librdkafka names a client.properties may set: how to connect and authenticate, nothing
# about what a client does (group ids, acks, ... belong to the lab's code, not to the file).
ALLOWED = frozenset({
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "ssl.ca.location", "ssl.ca.pem", "ssl.certificate.location", "ssl.certificate.pem",
    "ssl.key.location", "ssl.key.pem", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
    "sasl.oauthbearer.method", "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions", "sasl.oauthbearer.config",
    "client.dns.lookup", "client.id",
})
# Java client names people copy from a Java client.properties, and what librdkafka calls them.
JAVA_NAMES = {
    "sasl.jaas.config": "sasl.username and sasl.password",
    "ssl.truststore.location": "ssl.ca.location (a PEM file)",
    "ssl.truststore.password": "nothing (a PEM CA file has no password)",
    "ssl.truststore.type": "nothing (ssl.ca.location is a PEM file)",
    "ssl.keystore.location": "ssl.certificate.location and ssl.key.location (PEM files)",
    "ssl.keystore.password": "ssl.key.password",
    "ssl.keystore.type": "nothing (PEM files)",
}
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class ConnectionConfigError(lab_settings.SettingsError):
    """LABKIT_KAFKA_CONFIG names a file the lab cannot use; the message says what to change."""


def read_properties(path: Path) -> dict[str, str]:
    """``key=value`` lines (``key: value`` too); ``#`` and ``!`` start comments."""
    props: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise ConnectionConfigError(f"{path}:{number}: {line!r} is not name=value")
        props[line[:cut].strip()] = line[cut + 1:].strip()
    return props


def check(props: dict[str, str], source: str) -> dict[str, str]:
    """``props`` if every name is a connection property librdkafka knows, else a clear error."""
    problems = []
    for name in props:
        if name in ALLOWED:
            continue
        if name in JAVA_NAMES:
            problems.append(f"{name} is a Java client name; librdkafka's is {JAVA_NAMES[name]}")
        elif name == "bootstrap.servers":
            problems.append("bootstrap.servers: set LABKIT_BOOTSTRAP=host:port instead")
        else:
            problems.append(f"{name} is not a connection setting the lab accepts")
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        problems.append(f"security.protocol={props['security.protocol']} is not one of "
                        f"{', '.join(PROTOCOLS)}")
    if protocol.startswith("SASL") and not (props.get("sasl.mechanism")
                                             or props.get("sasl.mechanisms")):
        problems.append(f"security.protocol={protocol} needs sasl.mechanism (e.g. SCRAM-SHA-512)")
    for key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
        if key in props and not Path(props[key]).expanduser().is_file():
            problems.append(f"{key}={props[key]}: no such file")
    if problems:
        raise ConnectionConfigError(
            f"LABKIT_KAFKA_CONFIG={source}: " + "; ".join(problems)
            + f". Allowed names: {', '.join(sorted(ALLOWED))}")
    return props


def settings(path: Path | None = None) -> dict[str, str]:
    """The connection properties every client gets: from ``path``, else LABKIT_KAFKA_CONFIG
    (none set: ``{}``, plaintext without credentials)."""
    path = path if path is not None else lab_settings.current().kafka_config
    if path is None:
        return {}
    if not path.is_file():
        raise ConnectionConfigError(
            f"LABKIT_KAFKA_CONFIG={path}: no such file. `labkit up --secure` writes one "
            "(and prints the export line); unset LABKIT_KAFKA_CONFIG for a plaintext cluster")
    return check(read_properties(path), str(path))


def for_client(bootstrap: str | None) -> dict[str, str]:
    """What a client of ``bootstrap`` gets: ``settings()``, except for addresses that speak
    plaintext whatever the file says (a fault proxy's client side, LABKIT_PLAINTEXT)."""
    plaintext = lab_settings.current().plaintext
    if bootstrap and plaintext and {a.strip() for a in bootstrap.split(",")} <= plaintext:
        return {}
    return settings()


def write_properties(path: Path, props: dict[str, str], header: str = "") -> Path:
    """Write ``props`` readable by its owner only (it holds a password), whole then renamed."""
    lines = [f"# {line}" for line in header.splitlines()] + [f"{k}={v}" for k, v in props.items()]
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(0o600)
    os.replace(tmp, path)
    return path
