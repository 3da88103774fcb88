"""Debezium's PostgreSQL connector reading an outbox table, and what it keeps in PostgreSQL.

    source = OutboxSource.named("outbox-1", dsn, topic="payments-events")
    source.prepare()                          # the publication and the replication slot
    worker.rest.create(source.name, source.connector_config(exactly_once=True))
    ...
    source.slot()                             # where PostgreSQL thinks the reader is
    source.drop()                             # slot and publication gone (after the worker)

The connector (``io.debezium.connector.postgresql.PostgresConnector``, a plugin of the
Connect worker: ``labkit.kafka.connect``) reads the WAL through a logical replication slot
with PostgreSQL's own ``pgoutput`` plugin and a publication naming only the outbox table.
Debezium's outbox event router (``io.debezium.transforms.outbox.EventRouter``) turns each
inserted outbox row into one record: its ``payload`` column as the value, ``aggregateid``
as the key, the row's ``id`` in the record's ``id`` header, on ``topic``.

Where the reader's position is kept:
- Connect's offsets topic: ``{"lsn": ..., "lsn_commit": ..., "txId": ...}`` under the key
  ``["<connector>", {"server": "<name>"}]`` (``labkit.kafka.connect.stored_offsets``);
  Debezium resumes from it after a restart, skipping what it finds at or before it
  (``WalPositionLocator``): everything after it is sent again.
- the slot's ``confirmed_flush_lsn`` (``slot_state``): Debezium confirms an LSN to
  PostgreSQL only after Connect has written its offsets (``SourceTask.commit``), so the slot
  never runs ahead of the offsets topic and the WAL a restarted connector needs is kept.
- not in the table: the outbox rows stay, nothing marks them sent.

Slot and publication are created here, before the connector starts (with snapshot.mode
``no_data`` the connector then reads every outbox row committed after ``prepare``, whenever
it starts), and dropped by ``drop`` on every way out: a slot left behind keeps every WAL
segment after its position, forever.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from labkit.kafka import names
from labkit.storage import postgres
from labkit.storage.db import Database, dsn_parts, identifier, in_use

CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
EVENT_ROUTER = "io.debezium.transforms.outbox.EventRouter"
OUTBOX_TABLE = "outbox"
# Debezium's outbox columns (EventRouter's defaults), created by ``create_outbox``.
OUTBOX_DDL = """CREATE TABLE IF NOT EXISTS {table} (
    id            text PRIMARY KEY,   -- the event's own id: the record's "id" header
    aggregatetype text NOT NULL,      -- what the event is about (routes it)
    aggregateid   text NOT NULL,      -- which one: the record's key
    type          text NOT NULL,      -- what happened
    payload       text NOT NULL       -- the event, JSON text: the record's value
)"""


class DebeziumError(RuntimeError):
    """PostgreSQL cannot serve Debezium (no logical WAL, a slot in use); the message says what to do."""


def connect(dsn: str) -> Database:
    return Database(dsn, timeout_s=10)


pg_name = postgres.name_for  # a slot's or publication's name: [a-z0-9_], 63 characters


def create_outbox(dsn: str, table: str = OUTBOX_TABLE) -> None:
    """The outbox table (if it is not there yet)."""
    with connect(dsn) as db:
        db.execute(OUTBOX_DDL.format(table=identifier(table)))


@dataclass(frozen=True)
class OutboxSource:
    """One Debezium connector reading one outbox table into one topic."""

    name: str          # the connector's name, and its topic.prefix (the offsets' "server")
    dsn: str
    topic: str         # the broker's name of the topic the events go to
    slot: str          # the replication slot (this connector's alone)
    publication: str
    table: str = OUTBOX_TABLE
    schema: str = "public"  # the outbox table's (``dsn``'s search_path finds it there)

    @classmethod
    def named(cls, name: str, dsn: str, topic: str, table: str = OUTBOX_TABLE) -> "OutboxSource":
        """A source whose slot and publication are named after ``name`` (in the learner's
        namespace, as its topic): one per run, so runs never share a position."""
        full = pg_name(names.qualify(name))
        return cls(name, dsn, names.topic(topic), slot=full, publication=f"{full}_pub",
                   table=table)

    # -- the connector ------------------------------------------------------------------
    def connector_config(self, *, exactly_once: bool = False,
                         transaction_boundary: str = "interval") -> dict[str, str]:
        """The connector's config. ``exactly_once``: ``exactly.once.support=required`` (the
        worker refuses it unless exactly-once source support is enabled) with
        ``transaction.boundary`` (``interval``: one transaction per the worker's
        ``offset.flush.interval.ms``; ``poll``: one per batch Debezium returns)."""
        db = dsn_parts(self.dsn)
        config = {
            "connector.class": CONNECTOR_CLASS,
            "tasks.max": "1",  # Debezium reads one slot with one task
            "database.hostname": db.get("host", "127.0.0.1"),
            "database.port": db.get("port", "5432"),
            "database.user": db.get("user", "postgres"),
            "database.password": db.get("password", ""),
            "database.dbname": db.get("dbname", "postgres"),
            "topic.prefix": pg_name(names.qualify(self.name)),
            "plugin.name": "pgoutput",
            "slot.name": self.slot,
            "publication.name": self.publication,
            "publication.autocreate.mode": "disabled",  # ``prepare`` made it
            "table.include.list": f"{self.schema}.{self.table}",
            "snapshot.mode": "no_data",  # the slot's start is the start: rows after prepare()
            "transforms": "outbox",
            "transforms.outbox.type": EVENT_ROUTER,
            "transforms.outbox.route.by.field": "aggregatetype",
            # every event to one topic (the regex's group is not used)
            "transforms.outbox.route.topic.replacement": self.topic,
            "transforms.outbox.table.expand.json.payload": "false",
        }
        if exactly_once:
            config["exactly.once.support"] = "required"
            config["transaction.boundary"] = transaction_boundary
        return config

    # -- PostgreSQL's side ----------------------------------------------------------------
    def prepare(self) -> None:
        """The outbox table, its publication and the replication slot, if not there yet.
        From here on PostgreSQL keeps every outbox change for this connector."""
        with connect(self.dsn) as db:
            level = db.query("SHOW wal_level")[0][0]
            if level != "logical":
                raise DebeziumError(
                    f"this PostgreSQL runs with wal_level={level}; Debezium reads the WAL "
                    "through a logical replication slot: start it with wal_level=logical "
                    "(the lab's own server does; in postgresql.conf, then restart it)")
            db.execute(OUTBOX_DDL.format(table=identifier(self.table)))
            if not db.query("SELECT 1 FROM pg_publication WHERE pubname = ?",
                            (self.publication,)):
                db.execute(f"CREATE PUBLICATION {identifier(self.publication)} FOR TABLE "
                           f"{identifier(self.table)}")
            if not db.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = ?",
                            (self.slot,)):
                db.execute("SELECT pg_create_logical_replication_slot(?, 'pgoutput')",
                           (self.slot,))

    def slot_state(self) -> dict | None:
        """The slot as PostgreSQL sees it: ``active`` (a connector streams from it now),
        ``confirmed_flush_lsn`` (what the reader confirmed), ``restart_lsn``; None if gone."""
        with connect(self.dsn) as db:
            rows = db.query(
                "SELECT active, active_pid, confirmed_flush_lsn::text, restart_lsn::text "
                "FROM pg_replication_slots WHERE slot_name = ?", (self.slot,))
        if not rows:
            return None
        row = rows[0]
        return {"slot": self.slot, "active": row[0], "active_pid": row[1],
                "confirmed_flush_lsn": row[2], "restart_lsn": row[3]}

    def wait_streaming(self, timeout_s: float = 60.0) -> dict:
        """Until a connector streams from the slot (it is active); its state."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.slot_state()
            if state and state["active"]:
                return state
            if time.monotonic() > deadline:
                raise DebeziumError(f"nothing streamed from slot {self.slot} within "
                                    f"{timeout_s:.0f} s: {state}")
            time.sleep(0.2)

    def drop(self, timeout_s: float = 30.0) -> None:
        """Drop the slot and the publication (after the connector stopped: a slot still in
        use is released first by ending its reader's backend). Nothing there is fine."""
        with connect(self.dsn) as db:
            deadline = time.monotonic() + timeout_s
            while True:
                rows = db.query("SELECT active_pid FROM pg_replication_slots "
                                "WHERE slot_name = ?", (self.slot,))
                if not rows:
                    break
                if rows[0][0] is not None:  # a killed worker's walsender lingers until timeout
                    db.execute("SELECT pg_terminate_backend(?)", (rows[0][0],))
                try:
                    db.execute("SELECT pg_drop_replication_slot(?)", (self.slot,))
                    break
                except Exception as exc:  # the slot still in use: wait, then again
                    if not in_use(exc):
                        raise
                    if time.monotonic() > deadline:
                        raise DebeziumError(f"replication slot {self.slot} stays in use; stop "
                                            "the Connect worker that reads it") from None
                    time.sleep(0.2)
            db.execute(f"DROP PUBLICATION IF EXISTS {identifier(self.publication)}")


def lsn_text(lsn: int | None) -> str | None:
    """Debezium's offsets store LSNs as numbers; PostgreSQL writes them ``16/B374D848``."""
    return None if lsn is None else f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
