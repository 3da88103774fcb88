"""What `labkit up --secure` costs: start time, and one client's produce round trip, plain vs secure.

    .venv/bin/python benchmarks/secure.py [--runs 3]      # jars must be cached (make setup)

For each of plaintext and secure (SASL_SSL, SCRAM-SHA-512, ACLs), one broker then three:
the time to a ready lab (for secure: certificates, users, format, start, the learner's
ACLs), then on the one-broker lab a new producer's first acknowledged record (connection,
TLS handshake, SCRAM exchange, metadata) and 200 acknowledged records one at a time.
Prints one line per measurement; docs/measurements.md records the results. Nothing here is
asserted: the machine is shared and noisy.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer

from labkit.kafka import topics
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import LocalCluster


def round_trips(cluster: LocalCluster) -> tuple[float, float]:
    """Seconds to a new producer's first acknowledged record; median ms of 200 more."""
    if cluster.secure:
        os.environ["LABKIT_KAFKA_CONFIG"] = str(cluster.client_properties)
    try:
        topic = f"bench-secure-{uuid.uuid4().hex[:8]}"
        topics.create(cluster.bootstrap, topic)
        t0 = time.monotonic()
        producer = Producer(client_config({"bootstrap.servers": cluster.bootstrap,
                                           "linger.ms": 0}))
        producer.produce(topic, b"first")
        assert producer.flush(30) == 0
        first = time.monotonic() - t0
        each = []
        for i in range(200):
            t = time.monotonic()
            producer.produce(topic, str(i).encode())
            assert producer.flush(30) == 0
            each.append((time.monotonic() - t) * 1000)
        return first, statistics.median(each)
    finally:
        os.environ.pop("LABKIT_KAFKA_CONFIG", None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    for brokers in (1, 3):
        for secure in (False, True):
            starts, firsts, medians = [], [], []
            for _ in range(runs):
                with tempfile.TemporaryDirectory() as home:
                    t0 = time.monotonic()
                    cluster = LocalCluster(brokers=brokers, home=Path(home), secure=secure)
                    with cluster:  # started here, stopped on every path
                        starts.append(time.monotonic() - t0)
                        if brokers == 1:
                            first, median = round_trips(cluster)
                            firsts.append(first)
                            medians.append(median)
            kind = "secure" if secure else "plaintext"
            print(f"{brokers} broker(s) {kind:9}: ready in "
                  + ", ".join(f"{s:.1f}" for s in starts) + " s", flush=True)
            if firsts:
                print(f"  first acknowledged record {', '.join(f'{f:.2f}' for f in firsts)} s; "
                      f"one record acknowledged: median {', '.join(f'{m:.1f}' for m in medians)} ms",
                      flush=True)


if __name__ == "__main__":
    main()
