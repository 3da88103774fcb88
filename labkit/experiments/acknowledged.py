"""A client part: a producer whose delivery reports are what the run keeps, for the
experiments that check what a producer was told was written
(``labkit.checking.checks.AcknowledgedWrites``).

    clients=lambda run: AcknowledgingProducer(script, acks=run.o.acks)
    checkers=lambda o: [AcknowledgedWrites("leader-failover", f"acks={o.acks}",
                                           acknowledged=lambda run: run.clients.acked)]

``script(run, producer)`` is the experiment's own order of things: it sends the run's
records (``send``), waits for answers (``flush``), and reports the events its faults fire on
(``run.event``). Each record's partition is 0: the experiments break one partition's
replicas. The producer's facts: ``produced``, ``acknowledged`` and ``not_acknowledged``
(error name -> records).
"""
from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from labkit.kafka import topics
from labkit.kafka.clientlog import client_config


class AcknowledgingProducer:
    """The producer under test (acks as given, idempotent with acks=all since librdkafka's
    idempotence needs it, ``linger.ms`` 5). ``acked``: id -> the partition's leader in the
    producer's own metadata when the acknowledgement came (with ``track_leader``: its
    statistics every 100 ms; else None); ``acked_at``: id -> when (monotonic);
    ``refused``: error name -> records."""

    def __init__(self, script: Callable[[Any, "AcknowledgingProducer"], None], *, acks: str,
                 delivery_timeout_ms: int, track_leader: bool = False, role: str = "output"):
        self.script, self.acks, self.role = script, acks, role
        self.delivery_timeout_ms, self.track_leader = delivery_timeout_ms, track_leader
        self.acked: dict[str, int | None] = {}
        self.acked_at: dict[str, float] = {}
        self.refused: Counter[str] = Counter()
        self.sent = 0
        self.leader: int | None = None  # the producer's view (track_leader)
        self.topic = ""
        self.producer: Producer | None = None

    def __call__(self, run: Any) -> None:
        self.topic = run.topics[self.role]
        settings = {"bootstrap.servers": run.client_bootstrap, "acks": self.acks,
                    "enable.idempotence": self.acks == "all", "linger.ms": 5,
                    "message.timeout.ms": self.delivery_timeout_ms,
                    # its lines here would be about the broken broker's refusals and
                    # timeouts; what matters comes back in the delivery reports
                    "log_level": 2}
        if self.track_leader:
            settings.update({"statistics.interval.ms": 100, "stats_cb": self._statistics})
        self.producer = Producer(client_config(settings))
        self.script(run, self)
        run.facts.update(produced=self.sent, acknowledged=len(self.acked),
                         not_acknowledged=dict(self.refused))

    def send(self, records: list[dict], over_s: float | None = None) -> None:
        """Each record to partition 0; ``over_s``: one at a time, spread over that long
        (its answers served meanwhile)."""
        start = time.monotonic()
        for i, record in enumerate(records, 1):
            self.producer.produce(self.topic, topics.encode(record), partition=0,
                                  on_delivery=self._delivered)
            self.sent += 1
            if over_s is not None:
                until = start + over_s * i / len(records)
                while (left := until - time.monotonic()) > 0:  # poll returns at each callback
                    self.producer.poll(left)

    def flush(self, timeout_s: float) -> None:
        self.producer.flush(timeout_s)

    def _delivered(self, err, msg) -> None:
        rid = topics.decode(msg.value())["id"]
        if err is None:
            self.acked[rid], self.acked_at[rid] = self.leader, time.monotonic()
        else:
            self.refused[err.name()] += 1

    def _statistics(self, text: str) -> None:
        part = (json.loads(text).get("topics", {}).get(self.topic, {}).get("partitions", {})
                .get("0"))
        if part is not None:
            self.leader = part["leader"] if part["leader"] >= 0 else None


def halves(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """The records written before a fault, and those written during it."""
    return records[:len(records) // 2], records[len(records) // 2:]
