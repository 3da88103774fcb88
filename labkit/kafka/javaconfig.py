"""LABKIT_KAFKA_CONFIG for Java clients: librdkafka's property names turned into the Java
client's, the one translation Spark's Kafka source and sink and the harness's Java apps use.

``LABKIT_KAFKA_CONFIG`` is written in librdkafka's names (``labkit.kafka.connection`` reads and
checks it); a Java client (Spark's connector, Kafka Streams, the Java tools) wants its own::

    security.protocol=SASL_SSL              security.protocol=SASL_SSL
    sasl.mechanism=SCRAM-SHA-512            sasl.mechanism=SCRAM-SHA-512
    sasl.username=learner            ->     sasl.jaas.config=org.apache.kafka.common.security
    sasl.password=...                          .scram.ScramLoginModule required username=... ;
    ssl.ca.location=/path/ca.pem            ssl.truststore.type=PEM
                                            ssl.truststore.location=/path/ca.pem

``spark_options(bootstrap)`` gives them ``kafka.``-prefixed (Spark passes those to its Kafka
clients); ``write(path, bootstrap)`` writes them as a properties file for a Java app.
A fault proxy's own address (plaintext, ``LABKIT_PLAINTEXT``) gets none, as in
``labkit.kafka.connection.for_client``.
"""
from __future__ import annotations

from pathlib import Path

from labkit.kafka import connection
from labkit.kafka.connection import ConnectionConfigError

LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# Names that mean the same in both clients.
SAME_NAME = ("client.dns.lookup", "client.id")


def _jaas_quoted(value: str) -> str:
    # JAAS options are double-quoted strings read by a StreamTokenizer: \ and " are escaped.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _read(path: str) -> str:
    return Path(path).expanduser().read_text()


def java_properties(props: dict[str, str]) -> dict[str, str]:
    """The Java client properties meaning what ``props`` (librdkafka names, checked by
    ``labkit.kafka.connection``) means; a setting with no Java equivalent is a clear error."""
    out: dict[str, str] = {}
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol != "PLAINTEXT":
        out["security.protocol"] = protocol
    mechanism = (props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "").upper()
    if protocol.startswith("SASL"):
        if mechanism not in LOGIN_MODULES:
            raise ConnectionConfigError(
                f"sasl.mechanism={mechanism}: the lab translates {', '.join(LOGIN_MODULES)} for "
                "Java clients (Spark, Kafka Streams); write sasl.jaas.config yourself for others")
        out["sasl.mechanism"] = mechanism
        out["sasl.jaas.config"] = (
            f"{LOGIN_MODULES[mechanism]} required"
            f" username={_jaas_quoted(props.get('sasl.username', ''))}"
            f" password={_jaas_quoted(props.get('sasl.password', ''))};")
    if protocol in ("SSL", "SASL_SSL"):
        if props.get("ssl.ca.location"):
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.location"] = str(Path(props["ssl.ca.location"]).expanduser()
                                                 .resolve())
        elif props.get("ssl.ca.pem"):
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.certificates"] = props["ssl.ca.pem"]
        chain = props.get("ssl.certificate.pem") or (
            _read(props["ssl.certificate.location"]) if props.get("ssl.certificate.location") else "")
        key = props.get("ssl.key.pem") or (
            _read(props["ssl.key.location"]) if props.get("ssl.key.location") else "")
        if chain or key:  # mutual TLS: the Java client takes PEM contents, not file names
            out.update({"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": chain,
                        "ssl.keystore.key": key})
            if props.get("ssl.key.password"):
                out["ssl.key.password"] = props["ssl.key.password"]
        algorithm = props.get("ssl.endpoint.identification.algorithm")
        if algorithm is not None:
            out["ssl.endpoint.identification.algorithm"] = "" if algorithm.lower() == "none" \
                else algorithm
        if props.get("enable.ssl.certificate.verification", "true").lower() == "false":
            raise ConnectionConfigError(
                "enable.ssl.certificate.verification=false has no Java client equivalent: "
                "give the cluster's CA in ssl.ca.location instead")
    oauth = sorted(k for k in props if k.startswith("sasl.oauthbearer."))
    if oauth:
        raise ConnectionConfigError(f"{', '.join(oauth)}: the lab does not translate OAUTHBEARER "
                                    "settings for Java clients (Spark, Kafka Streams)")
    out.update({name: props[name] for name in SAME_NAME if name in props})
    return out


def for_client(bootstrap: str | None) -> dict[str, str]:
    """The Java client properties a client of ``bootstrap`` gets (LABKIT_KAFKA_CONFIG
    translated; nothing for a plaintext fault-proxy address or without the variable)."""
    return java_properties(connection.for_client(bootstrap))


def spark_options(bootstrap: str) -> dict[str, str]:
    """Options for Spark's Kafka source or sink: ``kafka.bootstrap.servers`` plus every
    translated property, ``kafka.``-prefixed (Spark hands those to its Kafka clients)."""
    return {"kafka.bootstrap.servers": bootstrap,
            **{f"kafka.{name}": value for name, value in for_client(bootstrap).items()}}


def write(path: Path, bootstrap: str) -> Path | None:
    """The translated properties for a Java app as a file (owner-only: it holds the
    password), or None when there is nothing to set."""
    props = for_client(bootstrap)
    if not props:
        return None
    return connection.write_properties(
        Path(path), {k: _escaped(v) for k, v in props.items()},
        header="Java client properties translated from LABKIT_KAFKA_CONFIG by labkit.kafka.javaconfig")


def _escaped(value: str) -> str:
    # java.util.Properties.load reads backslashes as escapes and a line end as the value's end.
    return value.replace("\\", "\\\\").replace("\n", "\\n")
