"""Where the Kafka clients' own log lines go: Python logging, not librdkafka's stderr.

librdkafka prints its log lines straight to stderr (``%4|1795293373.718|GETPID|...``): in a
notebook they land in red under whatever cell happened to be running, in no order the lab
controls. Every client the lab creates in a notebook kernel passes ``client_config(...)``,
which hands its log lines to one ``logging.Logger`` instead (confluent-kafka's ``logger``
setting). That logger decides what a learner sees:

* WARNING and above only (librdkafka levels 0-4); debug and info lines never pass;
* a warning the client recovers from by itself (its text ends in "retrying", e.g.
  "Coordinator load in progress: retrying" from a broker that has just started) is dropped;
* anything else is one short line on stderr: ``kafka client error: ...``.

A notebook that wants to show a client error does so on purpose, from the exception the
call raises. Logs reach the logger when the client is polled (poll, flush, consume).
"""
from __future__ import annotations

import logging
import sys

from labkit.kafka import connection, names

LOGGER_NAME = "labkit.kafka"
# A workaround for a librdkafka bug (2.10 to 2.16.1 at least; upstream issues 5511 and 5456,
# fixes proposed in PRs 5512 and 5457): once the broker cached as a consumer group's
# coordinator has left the cluster's metadata (killed, or frozen past
# broker.session.timeout.ms), send_offsets_to_transaction() waits, past its own timeout, for
# any broker connection to go up or down. With nothing else to do that can take until the
# broker closes an idle connection: 10 minutes by default. Closing our own idle connections
# after this long gives it that state change within seconds (measured in
# docs/measurements.md, "The coordinator stall").
COORDINATOR_STALL_WORKAROUND_MS = 5000


class _DropSelfHealing(logging.Filter):
    """Drop warnings the client resolves by retrying (nothing for a learner to act on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno < logging.ERROR
                    and record.getMessage().rstrip().endswith("retrying"))


class _Stderr(logging.StreamHandler):
    """Writes to the current sys.stderr (a notebook kernel replaces it after imports)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def client_logger() -> logging.Logger:
    """The logger every lab-created Kafka client writes to (set up once, then reused)."""
    log = logging.getLogger(LOGGER_NAME)
    if not log.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("kafka client %(levelname)s: %(message)s"))
        handler.addFilter(_DropSelfHealing())
        log.addHandler(handler)
        log.setLevel(logging.WARNING)
        log.propagate = False  # one line per event, even when the root logger has a handler
    return log


def client_config(config: dict) -> dict:
    """``config`` plus the ``logger`` entry: pass the result to Producer/Consumer/AdminClient.

    Its ``group.id`` and ``transactional.id`` are put in the learner's namespace here
    (``labkit.kafka.names``: unchanged on the local lab), the one place every lab client passes,
    so learners sharing a cluster never join each other's groups or fence each other.
    The connection settings of ``LABKIT_KAFKA_CONFIG`` (``labkit.kafka.connection``) are merged in
    here too, so every client reaches an authenticated cluster the same way.
    Nothing else is added: a setting that decides whether a loop survives (the idle
    connections' close, COORDINATOR_STALL_WORKAROUND_MS) is the caller's to write, in sight."""
    # The connection settings (LABKIT_KAFKA_CONFIG: credentials, TLS) come first, so a
    # setting the caller passes on purpose (the lab's own admin identity) wins.
    config = {**connection.for_client(config.get("bootstrap.servers")), **config,
              "logger": client_logger()}
    for key, rule in (("group.id", names.group), ("transactional.id", names.transactional_id)):
        if config.get(key):
            config[key] = rule(config[key])
    return config
