"""Idempotence has a memory: a broker forgets an idle producer (producer.id.expiration.ms).

    run = experiments.run("producer-expiry", expiration_ms=2000)
    run.report.duplicated                           # 10: the retry came after the broker forgot
    experiments.run("producer-expiry", expiration_ms=KAFKA_DEFAULT_MS).report.duplicated  # 0

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
both settings, whatever cluster the other lessons use. The parts: that broker, one topic,
the producer under test (``send_batch``, or the learner's), the proxy's two faults
(``ProxyFault``) and the audit of the topic (``TopicAudit``).
"""
from __future__ import annotations

from confluent_kafka import Producer

from labkit.checking.checks import TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workload, in_thread
from labkit.experiments.registry import OWN_BROKER, Experiment, Option, register
from labkit.faults.nemesis import Nemesis
from labkit.faults.wire_faults import ProxyFault
from labkit.kafka import exchanges, topics
from labkit.kafka.clientlog import client_config
from labkit.pipelines import data

SCENARIO = "producer-expiry"
KAFKA_DEFAULT_MS = 86_400_000  # producer.id.expiration.ms: one day
EXPIRATION_MS = 2000  # the run's default: the broker forgets a producer idle for 2 s
CHECK_INTERVAL_MS = 500
HOLD_MS = 4000  # each Produce request held back: the retry arrives > 2 x HOLD_MS after the batch
FAULT = "drop-ack:produce:1"  # the first batch is written, its answer never arrives
HOLD = f"delay:{HOLD_MS}:produce"


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


def _send(run) -> None:
    with run.status(f"One batch, its answer lost, its retry held back {HOLD_MS / 1000:.0f} s"):
        offsets = (run.pipeline or send_batch)(run.client_bootstrap, run.topics["output"],
                                               run.inputs)
    run.observe(acknowledged=len(offsets),
                acknowledged_at=(min(offsets, default=-1), max(offsets, default=-1)))


def _facts(run) -> dict:
    (proxy,) = run.nemesis.of(ProxyFault)
    produce = [exchange for exchange in proxy.exchanges if exchange["api"] == "Produce"]
    return {"expiration_ms": run.o.expiration_ms,
            "produce_requests": run.facts["fault_stats"]["requests"].get("Produce", 0),
            # the errors the broker answered Produce requests with, each once
            "produce_errors": exchanges.errors_answered(proxy.exchanges, "Produce"),
            "produce_trace": [_described(exchange) for exchange in produce]}


def _described(exchange: dict) -> str:
    """One Produce exchange of the proxy's trace in words, for a report a reader can check."""
    answer = "answer dropped" if exchange.get("dropped") else \
        f"answered {exchange['error'] or 'no error'}"
    return (f"client {exchange['client_id']} correlation {exchange['correlation_id']}: "
            f"{answer} after {exchange['ms']:.0f} ms")


def _summary(run) -> str:
    low, high = run.acknowledged_at
    return (f"producer.id.expiration.ms={run.expiration_ms}: "
            f"{run.acknowledged} acknowledged at offsets {low}-{high}, "
            f"{run.produce_requests} Produce requests, "
            f"broker answered: {', '.join(run.produce_errors) or 'no error'}\n"
            f"{run.report.summary()}")


register(Experiment(
    SCENARIO, "one idempotent batch, its answer lost and its retry held back, on a "
    "broker that forgets a producer after --expiration-ms",
    pipeline="the producer (as send_batch)", where=OWN_BROKER, options=(
        Option("expiration_ms", EXPIRATION_MS, "the broker's producer.id.expiration.ms "
               f"(Kafka's: {KAFKA_DEFAULT_MS})", kind=int, minimum=1,
               why=f"Kafka's default is {KAFKA_DEFAULT_MS}"),
        common.records(10, "records (one batch)", maximum=1000, why="they go out as one batch")),
    broker=lambda o: {"producer.id.expiration.ms": o.expiration_ms,
                      "producer.id.expiration.check.interval.ms": CHECK_INTERVAL_MS},
    workload=lambda o: Workload("expiry", (Topic("output"),), data.generate(o.records, prefix="e")),
    clients=in_thread(_send),
    nemesis=lambda o: Nemesis(ProxyFault((FAULT, HOLD), keep=True)),
    # idempotent, not transactional: at-least-once delivery, deduplicated by the broker
    checkers=lambda o: [TopicAudit(SCENARIO, "at_least_once",
                                   fault=f"{FAULT}, each Produce held {HOLD_MS} ms")],
    facts=_facts,
    presentation=Presentation(summary=_summary, json_facts=(
        "expiration_ms", "acknowledged", "acknowledged_at", "produce_requests",
        "produce_errors", "produce_trace"))))
