"""The lab's one database adapter: SQLite (a file path, the zero-setup default) or
PostgreSQL (a DSN), for the consumer pipelines, Spark's sinks and the audit alike.

    with Database("work/sink.db") as db:             # or "postgresql://user@host:port/db"
        with db.transaction():                       # BEGIN ... COMMIT, ROLLBACK on error
            db.executemany("INSERT INTO t (id, key) VALUES (?, ?)", rows)
        db.query("SELECT COUNT(*) FROM t")           # [(4,)]
    read_table("work/sink.db", "t", ["id", "key"])   # a DataFrame, in insertion order

Both are real ACID databases and the callers write the SQL both speak (``INSERT ... ON
CONFLICT``, not SQLite's ``INSERT OR REPLACE``) with ``?`` as the parameter marker, which is
rewritten here, in one place, for psycopg (``%s``). No other module imports ``sqlite3`` or
``psycopg`` (tests/test_architecture.py). A connection is in autocommit mode: a statement
outside ``transaction()`` (or ``begin``/``commit``) is durable on its own, as a naive sink's
insert is.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from labkit import settings

if TYPE_CHECKING:  # pandas only where a table is read: the pipelines' workers start without it
    import pandas as pd

SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")


def is_postgres(url: str | Path) -> bool:
    """Does ``url`` name a PostgreSQL database (a DSN), not a SQLite file?"""
    return str(url).startswith(POSTGRES_PREFIXES)


def sqlite_path(url: str | Path) -> Path:
    """The file a SQLite ``url`` names: a plain path, or ``sqlite:///path``."""
    text = str(url)
    if text.startswith(SQLITE_PREFIX):
        return Path(text.removeprefix(SQLITE_PREFIX))
    if "://" in text:
        raise ValueError(f"unsupported database {text!r}: use a SQLite file path (or "
                         "sqlite:///path/to/file.db) or postgresql://user@host:port/dbname")
    return Path(text)


def dsn_parts(dsn: str) -> dict[str, str]:
    """A PostgreSQL DSN's parts (host, port, user, password, dbname), for a client that takes
    them one by one (a Debezium connector's config)."""
    from psycopg.conninfo import conninfo_to_dict

    return {k: str(v) for k, v in conninfo_to_dict(dsn).items()}


def in_use(error: Exception) -> bool:
    """Did PostgreSQL refuse because the object is in use (a replication slot being read)?"""
    return getattr(error, "sqlstate", None) == "55006"  # object_in_use


def identifier(name: str) -> str:
    """``name`` if it may be spliced into SQL as a table or column name; else the error."""
    if not name.isidentifier() or not name.isascii():
        raise ValueError(f"not a table or column name: {name!r} (letters, digits and _ only)")
    return name


class Database:
    """One connection to a SQLite file or a PostgreSQL database.

    ``readonly``: never writes (SQLite: a missing file is an error, not a new empty one).
    ``wal``: SQLite's write-ahead log with synchronous=NORMAL, for a sink several processes
    share: a process kill never loses a committed row (a power cut could).
    """

    def __init__(self, url: str | Path, *, readonly: bool = False, wal: bool = False,
                 timeout_s: float = 30.0):
        self.url = str(url)
        if is_postgres(url):
            import psycopg  # only where a DSN is given: SQLite lessons never load it

            self.kind = "postgresql"
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=int(timeout_s))
            if readonly:
                self._conn.execute("SET default_transaction_read_only = on")
            return
        self.kind = "sqlite"
        path = sqlite_path(url)
        if readonly:
            self._conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                                         isolation_level=None, timeout=timeout_s)
            return
        # isolation_level=None: no implicit transactions, BEGIN/COMMIT are said here.
        self._conn = sqlite3.connect(path, isolation_level=None, timeout=timeout_s)
        if wal:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")

    def _sql(self, sql: str) -> str:
        # psycopg reads % as its own marker: a literal one is doubled first
        return sql.replace("%", "%%").replace("?", "%s") if self.kind == "postgresql" else sql

    # -- transactions -------------------------------------------------------------
    def begin(self) -> None:
        # IMMEDIATE takes SQLite's write lock up front (several instances may share the
        # file), as PostgreSQL's row locks would: no deadlock on upgrading a read lock.
        self._conn.execute("BEGIN IMMEDIATE" if self.kind == "sqlite" else "BEGIN")

    def commit(self) -> None:
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        self._conn.execute("ROLLBACK")

    @property
    def in_transaction(self) -> bool:
        if self.kind == "sqlite":
            return self._conn.in_transaction
        from psycopg.pq import TransactionStatus

        return self._conn.info.transaction_status != TransactionStatus.IDLE

    @contextmanager
    def transaction(self) -> Iterator["Database"]:
        """BEGIN ... COMMIT, or ROLLBACK if the block raises."""
        self.begin()
        try:
            yield self
        except BaseException:
            if self.in_transaction:
                self.rollback()
            raise
        self.commit()

    # -- statements -----------------------------------------------------------------
    def execute(self, sql: str, params: Sequence = ()) -> int:
        """Run one statement; the number of rows it changed (-1 where that means nothing)."""
        return self._conn.execute(self._sql(sql), tuple(params)).rowcount

    def executemany(self, sql: str, rows: Sequence[Sequence]) -> None:
        rows = [tuple(r) for r in rows]
        if rows:
            self._conn.cursor().executemany(self._sql(sql), rows)

    def query(self, sql: str, params: Sequence = ()) -> list[tuple]:
        cur = self._conn.cursor()
        cur.execute(self._sql(sql), tuple(params))
        return [tuple(r) for r in cur.fetchall()]

    def query_frame(self, sql: str, params: Sequence = ()) -> pd.DataFrame:
        """``query``'s rows as a DataFrame, with the columns the query names."""
        import pandas as pd

        cur = self._conn.cursor()
        cur.execute(self._sql(sql), tuple(params))
        return pd.DataFrame([tuple(r) for r in cur.fetchall()],
                            columns=[d[0] for d in cur.description])

    # -- tables ---------------------------------------------------------------------
    def sequence_column(self, name: str) -> str:
        """DDL for a column the database numbers itself, in insertion order: the order an
        audit may judge, unlike any number the writer supplies. One writer at a time here,
        so insertion order is commit order; a rolled-back insert only leaves a gap."""
        if self.kind == "sqlite":  # AUTOINCREMENT: numbers only grow, even after deletes
            return f"{identifier(name)} INTEGER PRIMARY KEY AUTOINCREMENT"
        return f"{identifier(name)} BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"

    def insertion_order(self, table: str) -> str:
        """What orders ``table``'s rows as they were inserted: SQLite's rowid (which an
        INTEGER PRIMARY KEY column is), PostgreSQL's identity column."""
        if self.kind == "sqlite":
            return "rowid"
        found = self.query("SELECT column_name FROM information_schema.columns "
                           "WHERE table_name = ? AND is_identity = 'YES' "
                           "AND table_schema = ANY (current_schemas(false))",
                           (identifier(table).lower(),))
        if not found:
            raise ValueError(f"table {table} has no identity column, and PostgreSQL keeps no "
                             "insertion order of its own: create it with "
                             "Database.sequence_column(...), or give order_by")
        return found[0][0]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_table(url: str | Path, table: str, columns: Sequence[str] | None = None,
               order_by: str | None = None) -> pd.DataFrame:
    """The rows of ``table`` (every column, or ``columns``), duplicates included, in
    ``order_by``'s order or else in insertion order (``Database.insertion_order``): the one
    reader the audit and the Spark checks use, for SQLite and PostgreSQL alike."""
    with Database(url, readonly=True) as db:
        order = identifier(order_by) if order_by else db.insertion_order(table)
        shown = ", ".join(map(identifier, columns)) if columns else "*"
        return db.query_frame(f"SELECT {shown} FROM {identifier(table)} ORDER BY {order}")


def default_url(workdir: str | Path, filename: str = "sink.db") -> str:
    """The database a run writes when none is named: ``LABKIT_PG_DSN`` if set, else a
    SQLite file in ``workdir``."""
    dsn = settings.current().pg_dsn
    return dsn or f"{SQLITE_PREFIX}{Path(workdir).resolve() / filename}"
