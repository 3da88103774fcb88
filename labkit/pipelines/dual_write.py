"""The dual write: a service that stores each payment in its database **and** sends an event
about it to Kafka, one after the other, with nothing tying the two together.

    run(bootstrap, dsn, topic, payments, order="table-first")

It works through ``payments`` in batches; a restarted service skips the payments its table
already holds (the table is its memory of what it did). Either order breaks under a crash
between the two writes:

- ``table-first``: the batch's transaction commits, then its events are sent. Killed in
  between (``after-db-commit-before-produce``), the restarted service finds the payments
  stored and never sends their events: **lost** events.
- ``kafka-first``: the events are sent, then the batch's transaction commits. Killed in
  between (``after-produce-before-db-commit``), the transaction is gone, the restarted
  service does the batch again and sends its events again: **duplicated** events.

The outbox (``labkit.pipelines.outbox``) is the way out: one transaction, no Kafka.
"""
from __future__ import annotations

import json

from confluent_kafka import Producer

from labkit.faults.crashpoints import crash_point
from labkit.kafka.clientlog import client_config
from labkit.storage.db import Database

ORDERS = {"table-first": "commit the payments' transaction, then send their events",
          "kafka-first": "send the events, then commit the payments' transaction"}
CRASH_POINTS = {"table-first": ("after-db-commit-before-produce",),
                "kafka-first": ("after-produce-before-db-commit",)}
BATCH = 10
TABLE_DDL = ("CREATE TABLE payments (id text PRIMARY KEY, account text NOT NULL, "
             "amount_cents integer NOT NULL)")


def create_table(dsn: str) -> None:
    with Database(dsn) as db:
        db.execute(TABLE_DDL)


def run(bootstrap: str, dsn: str, topic: str, payments: list[dict], order: str,
        batch_size: int = BATCH) -> None:
    """Store and announce every payment of ``payments`` not stored yet, ``order`` first."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    producer = Producer(client_config({"bootstrap.servers": bootstrap, "acks": "all"}))
    with Database(dsn) as db:
        done = {row[0] for row in db.query("SELECT id FROM payments")}
        todo = [p for p in payments if p["id"] not in done]
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            if order == "table-first":
                store(db, batch)
                crash_point("after-db-commit-before-produce")
                announce(producer, topic, batch)
            else:
                announce(producer, topic, batch)
                crash_point("after-produce-before-db-commit")
                store(db, batch)


def store(db: Database, batch: list[dict]) -> None:
    with db.transaction():
        db.executemany("INSERT INTO payments (id, account, amount_cents) VALUES (?, ?, ?)",
                       [(p["id"], p["key"], p["amount_cents"]) for p in batch])


def announce(producer: Producer, topic: str, batch: list[dict]) -> None:
    for p in batch:
        producer.produce(topic, key=p["key"], value=json.dumps(p))
    if producer.flush(30):
        raise RuntimeError("the events were not all acknowledged within 30 s")
