"""The outbox pattern's service: each payment and its event in ONE database transaction.

    create_tables(dsn)                       # payments and outbox (Debezium's columns)
    write(dsn, data.generate(500))           # 500 transactions, each: a payment + its event
    service = PacedService(dsn, records, rate=100)   # the same in a thread, 100 a second

The service never talks to Kafka. Its event is a row of the outbox table, committed with
the payment or not at all, so "the payment is stored but its event is lost" (or the
reverse) cannot happen here; Debezium (``labkit.storage.debezium``) reads the committed outbox
rows from the WAL and a Kafka Connect worker writes them to a topic. Each event's payload is
the payment record as JSON: its ``id`` is the event's id, what the audit counts.
"""
from __future__ import annotations

import json
import threading
import time
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


class PacedService:
    """The service writing its payments (and their outbox events) in a thread of its own, at
    ``rate`` a second (None: as fast as it can): it never waits for Kafka or Connect, so it
    goes on through whatever happens to them."""

    def __init__(self, dsn: str, records: list[dict], rate: float | None, *,
                 table: str = PAYMENTS_TABLE, outbox: str = OUTBOX_TABLE):
        self.args = (dsn, records, table, outbox)
        self.rate = rate
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="outbox-service", daemon=True)

    def _run(self) -> None:
        dsn, records, table, outbox_table = self.args
        began = time.monotonic()

        def pace(n: int) -> None:
            if self.halt.is_set():
                raise InterruptedError("the run ended")
            if self.rate:
                time.sleep(max(0.0, began + n / self.rate - time.monotonic()))
        try:
            write(dsn, records, table=table, outbox=outbox_table, each=pace)
        except BaseException as failed:  # noqa: BLE001 - reported by join()
            self.error = failed

    def start(self) -> None:
        self.thread.start()
        if self.rate is None:
            self.join()

    def join(self, timeout_s: float = 120.0) -> None:
        self.thread.join(timeout_s)
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self.halt.set()
        if self.thread.is_alive():
            self.thread.join(30)
