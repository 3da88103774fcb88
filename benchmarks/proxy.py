"""Throughput through the fault proxy vs straight to the broker (a measurement, not a test).

    .venv/bin/python benchmarks/proxy.py                 # starts its own broker, then stops it
    .venv/bin/python benchmarks/proxy.py --bootstrap HOST:PORT --records 10000 --rounds 3

Per round and path: produce N ~100-byte records (acks=all, flush), consume them back from
offset 0 with an assigned consumer, and time 200 produce+flush round trips one by one.
Results go to docs/measurements-proxy.md by hand, with the machine they ran on.
"""
from __future__ import annotations

import statistics
import tempfile
import time
import uuid

import typer
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from labkit.kafka import topics
from labkit.kafka.localcluster import LocalCluster
from labkit.faults.proxy import FaultProxy

VALUE = b"x" * 100


def produce(bootstrap: str, topic: str, n: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    start = time.perf_counter()
    for i in range(n):
        producer.produce(topic, value=VALUE, key=str(i))
        producer.poll(0)
    assert producer.flush(60) == 0
    return time.perf_counter() - start


def consume(bootstrap: str, topic: str, n: int) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                         "enable.auto.commit": False})
    start = time.perf_counter()
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got = 0
    while got < n:
        got += sum(1 for m in consumer.consume(1000, 5.0) if m.error() is None)
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def round_trips(bootstrap: str, topic: str, n: int = 200) -> float:
    """Median ms of one produce + flush (acks=all): the latency the proxy adds per request."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    producer.produce(topic, value=VALUE)
    producer.flush(30)  # connection and metadata warm
    times = []
    for _ in range(n):
        start = time.perf_counter()
        producer.produce(topic, value=VALUE)
        producer.flush(30)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def measure(bootstrap: str, records: int) -> dict[str, float]:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    topics.create(bootstrap, topic)
    p = produce(bootstrap, topic, records)
    c = consume(bootstrap, topic, records)
    return {"produce/s": records / p, "consume/s": records / c, "both/s": records / (p + c),
            "rtt ms": round_trips(bootstrap, topic)}


def main(bootstrap: str = typer.Option("", help="a running cluster (default: start one)"),
         records: int = typer.Option(10_000, min=1), rounds: int = typer.Option(3, min=1)) -> None:
    cluster = None
    if not bootstrap:
        cluster = LocalCluster(brokers=1, home=tempfile.mkdtemp(prefix="labkit-bench-")).start()
        bootstrap = cluster.bootstrap
    try:
        results: dict[str, list[dict[str, float]]] = {"direct": [], "proxy": []}
        with FaultProxy(bootstrap) as proxy:
            measure(bootstrap, records)  # warm up the broker's JIT, not counted
            for _ in range(rounds):  # interleaved so machine noise hits both paths alike
                results["direct"].append(measure(bootstrap, records))
                results["proxy"].append(measure(proxy.bootstrap, records))
            stats = proxy.stats()
        print(f"{records} records of {len(VALUE)} bytes, median of {rounds} rounds")
        print(f"{'path':<8}" + "".join(f"{k:>12}" for k in results["direct"][0]))
        for path, rows in results.items():
            medians = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            print(f"{path:<8}" + "".join(f"{v:>12.1f}" for v in medians.values()))
        print("proxy stats:", stats)
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    typer.run(main)
