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

The outbox is the way out: the event is a row of an ``outbox`` table, written in the
payments' transaction, and the service never talks to Kafka (Debezium reads the outbox:
``labkit.pipelines.outbox``). ``outbox`` is that order here: killed between the payments
and their outbox rows (``after-payment-before-event``), inside the transaction, it loses
neither; a service that writes them in two transactions would lose the events.
"""
from __future__ import annotations

import json

from confluent_kafka import Producer

from labkit.faults.crashpoints import crash_point
from labkit.kafka.clientlog import client_config
from labkit.pipelines.outbox import AGGREGATE, EVENT_TYPE
from labkit.storage.db import Database
from labkit.storage.debezium import create_outbox

ORDERS = {"table-first": "commit the payments' transaction, then send their events",
          "kafka-first": "send the events, then commit the payments' transaction",
          "outbox": "the payments and their events as outbox rows, in one transaction"}
CRASH_POINTS = {"table-first": ("after-db-commit-before-produce",),
                "kafka-first": ("after-produce-before-db-commit",),
                "outbox": ("after-payment-before-event",)}
BATCH = 10
TABLE_DDL = ("CREATE TABLE payments (id text PRIMARY KEY, account text NOT NULL, "
             "amount_cents integer NOT NULL)")


def create_table(dsn: str, outbox: bool = False) -> None:
    """The payments table (and with ``outbox``, Debezium's outbox table)."""
    with Database(dsn) as db:
        db.execute(TABLE_DDL)
    if outbox:
        create_outbox(dsn)


def run(dsn: str, payments: list[dict], order: str, bootstrap: str = "", topic: str = "",
        batch_size: int = BATCH) -> None:
    """Store and announce every payment of ``payments`` not stored yet, ``order`` first."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    producer = Producer(client_config({"bootstrap.servers": bootstrap, "acks": "all"})) \
        if order != "outbox" else None
    with Database(dsn) as db:
        done = {row[0] for row in db.query("SELECT id FROM payments")}
        todo = [p for p in payments if p["id"] not in done]
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            if order == "outbox":
                with db.transaction():  # the payments and their events: both, or neither
                    store(db, batch)
                    crash_point("after-payment-before-event")
                    record_events(db, batch)
            elif order == "table-first":
                with db.transaction():
                    store(db, batch)
                crash_point("after-db-commit-before-produce")
                announce(producer, topic, batch)
            else:
                announce(producer, topic, batch)
                crash_point("after-produce-before-db-commit")
                with db.transaction():
                    store(db, batch)


def store(db: Database, batch: list[dict]) -> None:
    db.executemany("INSERT INTO payments (id, account, amount_cents) VALUES (?, ?, ?)",
                   [(p["id"], p["key"], p["amount_cents"]) for p in batch])


def record_events(db: Database, batch: list[dict]) -> None:
    """Each payment's event as an outbox row (Debezium's columns: ``labkit.pipelines.outbox``)."""
    db.executemany("INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
                   "VALUES (?, ?, ?, ?, ?)", [(p["id"], AGGREGATE, p["key"], EVENT_TYPE,
                                               json.dumps(p, sort_keys=True)) for p in batch])


def announce(producer: Producer, topic: str, batch: list[dict]) -> None:
    for p in batch:
        producer.produce(topic, key=p["key"], value=json.dumps(p))
    if producer.flush(30):
        raise RuntimeError("the events were not all acknowledged within 30 s")
