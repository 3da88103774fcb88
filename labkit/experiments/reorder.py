"""Reordering on retry: a Produce request that fails while later ones are in flight.

    run = experiments.run("reorder", idempotent=False)
    run.report.reordered                              # 2: the retried batch, behind a later one
    experiments.run("reorder", idempotent=True).report.reordered   # 0

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

from confluent_kafka import Producer

from labkit.checking.checks import TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workload, in_thread
from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.faults.nemesis import Nemesis
from labkit.faults.wire_faults import ProxyFault
from labkit.kafka import exchanges, topics
from labkit.kafka.clientlog import client_config
from labkit.pipelines import data

SCENARIO = "reorder"
FAULT = "fail:produce:3"  # the 3rd Produce request answered by the proxy with a retriable error
BATCH = 2  # records per Produce request (batch.num.messages): several requests in flight
ACCOUNT = "acct-01"  # one key: its payments' order is the order that matters


def send_payments(bootstrap: str, topic: str, payments: list[dict], idempotent: bool) -> None:
    """The producer under test: small batches, several requests in flight, retries on."""
    producer = Producer(client_config({
        "bootstrap.servers": bootstrap, "enable.idempotence": idempotent,
        "max.in.flight.requests.per.connection": 5, "batch.num.messages": BATCH,
        "linger.ms": 0}))
    for payment in payments:
        producer.produce(topic, key=payment["key"], value=topics.encode(payment))
    producer.flush(30)


def _facts(run) -> dict:
    (proxy,) = run.nemesis.of(ProxyFault)
    stats = run.facts["fault_stats"]
    return {"idempotent": run.o.idempotent,
            "produce_requests": stats["requests"].get("Produce", 0),
            "failed": stats["requests_failed"],
            # the errors the producer was answered with, each once, as the proxy recorded them
            "produce_errors": exchanges.errors_answered(proxy.exchanges, "Produce")}


register(Experiment(
    SCENARIO, "one account's payments, the 3rd Produce failing behind the 4th: does a retry "
    "reorder them?",
    pipeline="the producer (as send_payments)",
    options=(Option("idempotent", REQUIRED, "the producer's enable.idempotence", kind=bool),
             common.records(20, "payments", minimum=4 * BATCH, why=f"batches of {BATCH}; the 3rd fails while the 4th "
                                           "is in flight")),
    workload=lambda o: Workload(SCENARIO, (Topic("output"),),
                                [dict(p, key=ACCOUNT) for p in data.generate(o.records, prefix="o")]),
    clients=in_thread(lambda run: (run.pipeline or send_payments)(
        run.client_bootstrap, run.topics["output"], run.inputs, run.o.idempotent)),
    nemesis=lambda o: Nemesis(ProxyFault(FAULT, keep=True)),
    checkers=lambda o: [TopicAudit(SCENARIO, "exactly_once" if o.idempotent else "at_least_once",
                                   fault=FAULT)],
    facts=_facts,
    presentation=Presentation(json_facts=("idempotent", "produce_requests", "failed",
                                          "produce_errors"))))
