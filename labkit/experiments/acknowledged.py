"""A client part: a producer whose delivery reports are what the run keeps, for the
experiments that check what a producer was told was written
(``labkit.checking.checks.AcknowledgedWrites``).

    clients=lambda run: AcknowledgingProducer(script, acks=run.o.acks)
    checkers=lambda o: [AcknowledgedWrites("leader-failover", f"acks={o.acks}",
                                           acknowledged=lambda run: run.clients.acked)]

``script(run, producer)`` is the experiment's own order of things: it sends the run's
records (``send``), waits for answers (``flush``), and reports the events its faults fire on
(``run.event``). Each record's partition is 0: the experiments break one partition's
replicas. The producer is made from ``settings(bootstrap, acks)``: the learner's function
(its notebook's cell, ``pipeline=``) or the experiment's reference one. The producer's
facts: ``produced``, ``acknowledged`` and ``not_acknowledged`` (error name -> records).

Which broker acknowledged a record (``track_broker``): the broker the producer was sending
the partition to (librdkafka's statistics, every 100 ms: the partition's ``broker``) at the
first sample after the acknowledgement arrived; a producer sends a partition's records only
to that broker. (The statistics' ``leader`` field lagged behind for seconds when the producer
learnt the new leader from a produce error, and a sample before the acknowledgement can
predate the move: both misnamed the broker in runs under load.)
"""
from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from labkit.kafka import topics
from labkit.pipelines.learner import producer_from
from labkit.progress import wait_until


class AcknowledgingProducer:
    """The producer under test, made from ``settings``. ``acked``: id -> the broker that
    acknowledged it (with ``track_broker``, see the module's docstring, known once ``flush``
    has returned; else None); ``acked_at``: id -> when (monotonic); ``refused``: error name
    -> records."""

    def __init__(self, script: Callable[[Any, "AcknowledgingProducer"], None], *, acks: str,
                 settings: Callable[..., dict], track_broker: bool = False,
                 role: str = "output"):
        self.script, self.acks, self.settings, self.role = script, acks, settings, role
        self.track_broker = track_broker
        self.acked: dict[str, int | None] = {}
        self.acked_at: dict[str, float] = {}
        self.refused: Counter[str] = Counter()
        self.sent = 0
        self.sending_to: list[tuple[float, int]] = []  # (when, broker), from the statistics
        self.topic = ""
        self.producer: Producer | None = None

    def __call__(self, run: Any) -> None:
        self.topic = run.topics[self.role]
        # What the lab adds to watch the producer, never the learner's settings: its log
        # lines here would be about the broken broker's refusals and timeouts (what
        # matters comes back in the delivery reports), its statistics name the broker.
        watching: dict[str, Any] = {"log_level": 2}
        if self.track_broker:
            watching.update({"statistics.interval.ms": 100, "stats_cb": self._statistics})
        self.producer = producer_from(self.settings, run.client_bootstrap, self.acks,
                                      **watching)
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
        if self.track_broker and self.acked_at:  # a sample after the last acknowledgement
            settled = time.monotonic()
            wait_until(lambda: self.producer.poll(0.1) is not None and bool(self.sending_to)
                       and self.sending_to[-1][0] > settled,
                       "the producer's statistics after its last acknowledgement", 10)
            self.acked = {rid: self._acknowledged_by(when) for rid, when in self.acked_at.items()}

    def _acknowledged_by(self, when: float) -> int | None:
        """The broker the producer sent to at the first statistics after ``when``: a record
        goes to that broker only, and its answer comes back before the producer moves on."""
        return next((broker for t, broker in self.sending_to if t >= when), None)

    def _delivered(self, err, msg) -> None:
        rid = topics.decode(msg.value())["id"]
        if err is None:
            self.acked[rid], self.acked_at[rid] = None, time.monotonic()
        else:
            self.refused[err.name()] += 1

    def _statistics(self, text: str) -> None:
        part = (json.loads(text).get("topics", {}).get(self.topic, {}).get("partitions", {})
                .get("0"))
        if part is not None and part["broker"] >= 0:  # -1: between two brokers
            self.sending_to.append((time.monotonic(), part["broker"]))


def halves(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """The records written before a fault, and those written during it."""
    return records[:len(records) // 2], records[len(records) // 2:]
