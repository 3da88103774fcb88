"""Idempotence has a memory: a broker forgets an idle producer (producer.id.expiration.ms).

    run = producer_expiry(expiration_ms=2000)      # -> ExpiryRun
    run.report.duplicated                           # 10: the retry came after the broker forgot
    producer_expiry(expiration_ms=KAFKA_DEFAULT_MS).report.duplicated   # 0

An idempotent producer sends one batch of payments through the lab's fault proxy. The
broker writes it; the proxy swallows the answer and closes the connection, and it holds
every Produce request back ``HOLD_MS``, so the client's retry (same producer id, same
sequence numbers) reaches the broker seconds after the batch was made. A broker that still
remembers the producer recognises the sequence numbers and answers with the offsets it
wrote them at, no error: the batch is in the log once. A broker that dropped the producer's
state meanwhile (its last batch older than producer.id.expiration.ms) cannot tell, and
writes the batch again: twice in the log, each payment acknowledged once, at the offsets of
the second copy.

The expiration is checked only every producer.id.expiration.check.interval.ms, a setting
read when the broker starts (Kafka: 10 min), so each run starts a broker of its own with
both settings, whatever cluster the other lessons use.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Producer

from labkit.checking import audit

from labkit.kafka import exchanges, names, topics

from labkit.pipelines import data
from labkit.checking.audit import AuditReport
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import private_cluster
from labkit.faults.proxy import FaultProxy
from labkit.experiments.registry import OWN_BROKER, Experiment, Option, RunBasics, register
from labkit.progress import status

SCENARIO = "producer-expiry"
KAFKA_DEFAULT_MS = 86_400_000  # producer.id.expiration.ms: one day
EXPIRATION_MS = 2000  # the run's default: the broker forgets a producer idle for 2 s
CHECK_INTERVAL_MS = 500
HOLD_MS = 4000  # each Produce request held back: the retry arrives > 2 x HOLD_MS after the batch
FAULT = "drop-ack:produce:1"  # the first batch is written, its answer never arrives


@dataclass
class ExpiryRun(RunBasics):
    report: AuditReport
    expiration_ms: int
    acknowledged: int  # delivery reports without an error
    acknowledged_at: tuple[int, int]  # the lowest and highest offset they reported
    produce_requests: int  # Produce requests the proxy saw (the retry included)
    # the errors the broker answered Produce requests with, each once (the proxy's record)
    produce_errors: list[str] = field(default_factory=list)
    # each Produce request as the proxy saw it, in order: who sent it and what came back
    produce_trace: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({**json.loads(self.report.to_json()),
                           "expiration_ms": self.expiration_ms, "acknowledged": self.acknowledged,
                           "acknowledged_at": list(self.acknowledged_at),
                           "produce_requests": self.produce_requests,
                           "produce_errors": self.produce_errors,
                           "produce_trace": self.produce_trace})

    def summary(self) -> str:
        return (f"producer.id.expiration.ms={self.expiration_ms}: "
                f"{self.acknowledged} acknowledged at offsets {self.acknowledged_at[0]}-"
                f"{self.acknowledged_at[1]}, {self.produce_requests} Produce requests, "
                f"broker answered: {', '.join(self.produce_errors) or 'no error'}\n"
                f"{self.report.summary()}")


def check_expiration(expiration_ms: int, kafka_default_ms: int) -> None:
    """An expiration setting a broker takes, or a ValueError that names Kafka's default."""
    if expiration_ms < 1:
        raise ValueError(f"expiration_ms must be 1 or more (Kafka's default is "
                         f"{kafka_default_ms}), not {expiration_ms}")


def check_settings(expiration_ms: int, records: int) -> None:
    """A ValueError that says what to use, before any broker starts."""
    check_expiration(expiration_ms, KAFKA_DEFAULT_MS)
    if not 1 <= records <= 1000:
        raise ValueError(f"records must be 1 to 1000 (they go out as one batch), not {records}")


def send_batch(bootstrap: str, topic: str, payments: list[dict]) -> list[int]:
    """The producer under test, idempotent; the payments go out as one batch. Returns the
    offsets its delivery reports acknowledged."""
    acknowledged: list[int] = []
    producer = Producer(client_config({
        "bootstrap.servers": bootstrap, "enable.idempotence": True,
        "linger.ms": 100,  # one batch: the proxy's fault hits all of it
        "message.timeout.ms": 60_000}))
    for payment in payments:
        producer.produce(topic, key=payment["key"], value=topics.encode(payment),
                         on_delivery=lambda err, msg: err or acknowledged.append(msg.offset()))
    producer.flush(90)
    return acknowledged


def producer_expiry(expiration_ms: int = EXPIRATION_MS, records: int = 10,
                    announce: Callable[[str], None] = print,
                    send: Callable[[str, str, list[dict]], list[int]] = send_batch) -> ExpiryRun:
    """One batch, its answer lost and its retry held back, on a broker that forgets a
    producer after ``expiration_ms``; the audit reads the topic afterwards."""
    check_settings(expiration_ms, records)
    announce("This experiment changes a broker setting, so it starts a Kafka of its own on "
             "this machine (one broker), whatever cluster your other lessons use.")
    properties = {"producer.id.expiration.ms": expiration_ms,
                  "producer.id.expiration.check.interval.ms": CHECK_INTERVAL_MS}
    with private_cluster("producer-expiry-", properties=properties) as lab:
        topic = names.topic("expiry")
        topics.create(lab.bootstrap, topic)
        payments = data.generate(records, prefix="e")
        wire: list[dict] = []
        with status(f"One batch, its answer lost, its retry held back {HOLD_MS / 1000:.0f} s"), \
                FaultProxy(lab.bootstrap, FAULT, trace=wire.append) as proxy:
            proxy.delay(HOLD_MS, "Produce")
            offsets = send(proxy.bootstrap, topic, payments)
            stats = proxy.stats()
        errors = exchanges.errors_answered(wire, "Produce")
        trace = [_described(exchange) for exchange in wire if exchange["api"] == "Produce"]
        # idempotent, not transactional: at-least-once delivery, deduplicated by the broker
        report = audit.audit_topic(lab.bootstrap, topic, payments, SCENARIO, "at_least_once",
                                   fault=f"{FAULT}, each Produce held {HOLD_MS} ms")
    return ExpiryRun(report, expiration_ms, len(offsets),
                     (min(offsets, default=-1), max(offsets, default=-1)),
                     stats["requests"].get("Produce", 0), errors, trace)


def _described(exchange: dict) -> str:
    """One Produce exchange of the proxy's trace in words, for a report a reader can check."""
    answer = "answer dropped" if exchange.get("dropped") else \
        f"answered {exchange['error'] or 'no error'}"
    return (f"client {exchange['client_id']} correlation {exchange['correlation_id']}: "
            f"{answer} after {exchange['ms']:.0f} ms")


register(Experiment(
    "producer-expiry", "one idempotent batch, its answer lost and its retry held back, on a "
    "broker that forgets a producer after --expiration-ms",
    lambda context, expiration_ms, records: producer_expiry(
        expiration_ms, records, announce=context.announce, send=context.pipeline or send_batch),
    pipeline="the producer (as send_batch)", where=OWN_BROKER, check=check_settings, options=(
        Option("expiration_ms", EXPIRATION_MS, "the broker's producer.id.expiration.ms "
               f"(Kafka's: {KAFKA_DEFAULT_MS})", kind=int),
        Option("records", 10, "how many records (one batch)", kind=int, short="-n"))))
