"""Reordering on retry: a Produce request that fails while later ones are in flight.

    run = reorder(lab.bootstrap, idempotent=False)   # -> ReorderRun
    run.report.reordered                              # 2: the retried batch, behind a later one
    reorder(lab.bootstrap, idempotent=True).report.reordered   # 0

One account's payments go out in small batches (2 records each), up to five requests in
flight on one connection (``max.in.flight.requests.per.connection`` 5: the Java client's
default, and librdkafka's most with idempotence; librdkafka's own default is 1000000).
Between the producer and the broker, the lab's fault proxy answers the 3rd Produce request
itself with NOT_LEADER_OR_FOLLOWER (a retriable error, as from a broker that just lost the
partition), once the 4th is on its way: the 4th batch lands first, and the client retries
the 3rd behind it. Without idempotence the retry is a new write at the end of the log: the
checker's ``reordered`` counts the account's payments that come after a later one. With
idempotence the broker refuses the 4th batch's sequence number while the 3rd is missing
(OUT_OF_ORDER_SEQUENCE_NUMBER), and the client sends both again in order.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Producer

from labkit.checking import audit

from labkit.kafka import names, protocol, topics

from labkit.pipelines import data
from labkit.checking.audit import AuditReport
from labkit.kafka.clientlog import client_config
from labkit.experiments.registry import REQUIRED, Experiment, Option, RunBasics, register
from labkit.faults.proxy import FaultProxy

SCENARIO = "reorder"
FAULT = "fail:produce:3"  # the 3rd Produce request answered by the proxy with a retriable error
BATCH = 2  # records per Produce request (batch.num.messages): several requests in flight
ACCOUNT = "acct-01"  # one key: its payments' order is the order that matters


@dataclass
class ReorderRun(RunBasics):
    report: AuditReport
    idempotent: bool
    produce_requests: int  # Produce requests the proxy saw (the failed one and its retry included)
    failed: int  # Produce requests the proxy answered itself
    # the errors the producer was answered with, each once, as the proxy recorded them
    produce_errors: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({**json.loads(self.report.to_json()), "idempotent": self.idempotent,
                           "produce_requests": self.produce_requests, "failed": self.failed,
                           "produce_errors": self.produce_errors})


def check_records(records: int) -> None:
    """A ValueError that says what to use, before anything is written."""
    if records < 4 * BATCH:
        raise ValueError(f"records must be {4 * BATCH} or more (batches of {BATCH}; the 3rd "
                         "fails while the 4th is in flight)")


def send_payments(bootstrap: str, topic: str, payments: list[dict], idempotent: bool) -> None:
    """The producer under test: small batches, several requests in flight, retries on."""
    producer = Producer(client_config({
        "bootstrap.servers": bootstrap, "enable.idempotence": idempotent,
        "max.in.flight.requests.per.connection": 5, "batch.num.messages": BATCH,
        "linger.ms": 0}))
    for payment in payments:
        producer.produce(topic, key=payment["key"], value=topics.encode(payment))
    producer.flush(30)


def reorder(bootstrap: str, idempotent: bool, records: int = 20,
            send: Callable[[str, str, list[dict], bool], None] = send_payments) -> ReorderRun:
    """Send ``records`` payments of one account through the fault proxy (its 3rd Produce
    fails, retriably, behind the 4th) and audit the partition's order."""
    check_records(records)
    topic = names.topic(f"reorder-{time.monotonic_ns() % 10**9}")
    topics.create(bootstrap, topic)
    payments = [dict(p, key=ACCOUNT) for p in data.generate(records, prefix="o")]
    wire: list[dict] = []
    with FaultProxy(bootstrap, FAULT, trace=wire.append) as proxy:
        send(proxy.bootstrap, topic, payments, idempotent)
        stats = proxy.stats()
    errors = protocol.errors_answered(wire, "Produce")
    report = audit.audit_topic(bootstrap, topic, payments, SCENARIO,
                               "exactly_once" if idempotent else "at_least_once", fault=FAULT)
    topics.delete(bootstrap, topic)
    return ReorderRun(report, idempotent, stats["requests"].get("Produce", 0),
                      stats["requests_failed"], errors)


register(Experiment(
    "reorder", "one account's payments, the 3rd Produce failing behind the 4th: does a retry "
    "reorder them?",
    lambda context, idempotent, records: reorder(context.bootstrap, idempotent, records,
                                                 send=context.pipeline or send_payments),
    pipeline="the producer (as send_payments)", check=lambda idempotent, records: check_records(records), options=(
        Option("idempotent", REQUIRED, "the producer's enable.idempotence", kind=bool),
        Option("records", 20, "how many payments", kind=int, short="-n"))))
