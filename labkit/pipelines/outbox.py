"""The outbox pattern's service: each payment and its event in ONE database transaction.

    create_tables(dsn)                       # payments and outbox (Debezium's columns)
    write(dsn, data.generate(500))           # 500 transactions, each: a payment + its event

The service never talks to Kafka. Its event is a row of the outbox table, committed with
the payment or not at all, so "the payment is stored but its event is lost" (or the
reverse) cannot happen here; Debezium (``labkit.storage.debezium``) reads the committed outbox
rows from the WAL and a Kafka Connect worker writes them to a topic. Each event's payload is
the payment record as JSON: its ``id`` is the event's id, what the audit counts.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from labkit.storage.db import identifier
from labkit.storage.debezium import OUTBOX_TABLE, connect, create_outbox

PAYMENTS_TABLE = "payments"
AGGREGATE = "payment"
EVENT_TYPE = "PaymentReceived"


def create_tables(dsn: str, table: str = PAYMENTS_TABLE, outbox: str = OUTBOX_TABLE) -> None:
    with connect(dsn) as db:
        db.execute(f"CREATE TABLE IF NOT EXISTS {identifier(table)} (id text PRIMARY KEY, "
                   "account text NOT NULL, amount_cents integer NOT NULL)")
    create_outbox(dsn, outbox)


def write(dsn: str, records: Iterable[dict], *, table: str = PAYMENTS_TABLE,
          outbox: str = OUTBOX_TABLE, each: Callable[[int], None] | None = None) -> int:
    """Store each record as a payment and its outbox event, one transaction per record;
    ``each(n)`` after the n-th commit (progress, a pause). Returns how many were written."""
    insert_payment = (f"INSERT INTO {identifier(table)} (id, account, amount_cents) "
                      "VALUES (?, ?, ?)")
    insert_event = (f"INSERT INTO {identifier(outbox)} (id, aggregatetype, aggregateid, type, "
                    "payload) VALUES (?, ?, ?, ?, ?)")
    written = 0
    with connect(dsn) as db:
        for r in records:
            with db.transaction():  # both rows, or neither
                db.execute(insert_payment, (r["id"], r["key"], r.get("amount_cents", 0)))
                db.execute(insert_event, (r["id"], AGGREGATE, r["key"], EVENT_TYPE,
                                          json.dumps(r, sort_keys=True)))
            written += 1
            if each is not None:
                each(written)
    return written
