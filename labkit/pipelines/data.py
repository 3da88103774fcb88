"""Input data: a deterministic record generator, the lab's CSV data sets, a topic loader.

Every record has a unique ``id`` (what the audit counts) and a ``key`` (what per-key order
and running counts are about). The same ``n`` and ``seed`` always give the same records,
so an experiment's numbers are the same on every run.

    records = generate(200, seed=0)                     # [{'id': 'r-000001', 'key': ...}, ...]
    load_into_topic(bootstrap, "payments-in", records)  # one partition, in order, no duplicates
    produce_at_rate(bootstrap, topic, records, 100, stop, failed)  # a stream: 100 a second
"""
from __future__ import annotations

import csv
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import Producer

from labkit.kafka import names, topics
from labkit.kafka.clientlog import client_config
from labkit.paths import project_root

DEFAULT_KEYS: tuple[str, ...] = tuple(f"acct-{i:02d}" for i in range(1, 9))
CURRENCIES = ("EUR", "EUR", "EUR", "USD", "GBP")  # weighted: mostly EUR
DATASETS = ("payments", "clicks")
BASE_TS_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, fixed so data never depends on "now"


def keys_for(partitions: int) -> tuple[str, ...]:
    """Keys for an input of ``partitions`` partitions: the 8 default accounts, or 4 per
    partition when there are more partitions, so that hashing leaves none of them empty."""
    if partitions <= 2:
        return DEFAULT_KEYS
    return tuple(f"acct-{i:02d}" for i in range(1, 4 * partitions + 1))


def generate(n: int, seed: int = 0, keys: Sequence[str] = DEFAULT_KEYS,
             prefix: str = "r") -> list[dict]:
    """``n`` payment-like records with unique ids ``<prefix>-000001`` ... in input order."""
    if n < 0:
        raise ValueError(f"n must be 0 or more, not {n}")
    if not keys:
        raise ValueError("keys must name at least one key")
    rng = random.Random(seed)
    ts = BASE_TS_MS
    out = []
    for i in range(1, n + 1):
        ts += rng.randint(20, 2_000)
        out.append({
            "id": f"{prefix}-{i:06d}",
            "key": rng.choice(list(keys)),
            "amount_cents": rng.randint(100, 50_000),
            "currency": rng.choice(CURRENCIES),
            "ts": ts,
        })
    return out


def generate_clicks(n: int, seed: int = 0, users: int = 20) -> list[dict]:
    """``n`` click events with unique ids; ``key`` is the user id (per-user order matters)."""
    rng = random.Random(seed)
    pages = ("/", "/search", "/product", "/cart", "/checkout", "/help")
    ts = BASE_TS_MS
    sessions: dict[str, int] = {}
    out = []
    for i in range(1, n + 1):
        ts += rng.randint(10, 3_000)
        user = f"user-{rng.randint(1, users):03d}"
        if user not in sessions or rng.random() < 0.1:  # a new session now and then
            sessions[user] = sessions.get(user, 0) + 1
        out.append({"id": f"c-{i:06d}", "key": user, "page": rng.choice(pages),
                    "session": f"{user}-s{sessions[user]}", "ts": ts})
    return out


def data_dir() -> Path:
    return project_root() / "data"


def load_csv(name: str) -> list[dict]:
    """A data set from data/ as records (numbers as int), e.g. ``load_csv("payments")``."""
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    with open(data_dir() / f"{name}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        for k, v in row.items():
            if v.lstrip("-").isdigit():
                row[k] = int(v)
    return rows


def write_csv(path: Path, records: Sequence[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)


def load_into_topic(bootstrap: str, topic: str, records: Sequence[dict],
                    partitions: int = 1) -> int:
    """Create ``topic`` and write ``records`` into it, in order, each exactly once.

    The idempotent producer makes retries safe, so the input itself is never the cause of
    a duplicate the audit later finds. Returns how many records were written.
    """
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError("records must have unique ids: the audit counts by id")
    topic = names.topic(topic)  # the learner's namespace on a shared cluster (labkit.kafka.names)
    topics.create(bootstrap, topic, partitions=partitions)
    producer = Producer(client_config({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                       "linger.ms": 5}))
    failed: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            failed.append(str(err))

    for r in records:
        producer.produce(topic, key=str(r["key"]).encode(), value=topics.encode(r),
                         on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(30)
    if remaining or failed:
        raise RuntimeError(f"loading {topic}: {remaining} record(s) undelivered, "
                           f"errors: {failed[:3]}")
    return len(records)


def produce_at_rate(bootstrap: str, topic: str, records: Sequence[dict], rate: float,
                    stop: threading.Event, failed: list[str]) -> None:
    """Write ``records`` at ``rate`` a second until ``stop`` is set (or none is left), as a
    stream for a pipeline that runs meanwhile: each record's CreateTime is the moment it was
    produced. Delivery errors are appended to ``failed``."""
    producer = Producer(client_config({"bootstrap.servers": bootstrap, "linger.ms": 0,
                                       "enable.idempotence": True}))
    start = time.monotonic()
    for i, record in enumerate(records):
        if stop.wait(max(0.0, start + i / rate - time.monotonic())):
            break
        producer.produce(topic, key=str(record["key"]).encode(), value=topics.encode(record),
                         on_delivery=lambda err, _: err is not None and failed.append(str(err)))
        producer.poll(0)
    if producer.flush(30):
        failed.append("records left undelivered after 30 s")
