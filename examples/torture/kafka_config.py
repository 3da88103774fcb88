"""The connection settings an app under `labkit torture` is given: LABKIT_KAFKA_CONFIG.

The harness passes the path of a client.properties in librdkafka's names (security.protocol,
sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, ...) when the cluster wants
TLS or credentials, and nothing otherwise. An app the lab did not write reads it the way any
app reads its deployment's client config: ``key=value`` lines into its client settings.
"""
import os


def kafka_config() -> dict:
    """librdkafka settings from $LABKIT_KAFKA_CONFIG ({} when unset: plaintext)."""
    path = os.environ.get("LABKIT_KAFKA_CONFIG")
    if not path:
        return {}
    config = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            line = line.strip()
            if line and line[0] not in "#!" and "=" in line:
                name, _, value = line.partition("=")
                config[name.strip()] = value.strip()
    return config
