"""The sinks' database: SQLite by default, PostgreSQL when LABKIT_PG_DSN is set.

Both are real ACID databases. The sinks need only four things from them (a transaction,
execute, executemany, query), and the same SQL works on both apart from the parameter
marker, which this adapter rewrites (``?`` -> ``%s`` for psycopg).
"""
from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from labkit import settings

ENV_DSN = "LABKIT_PG_DSN"


def default_url(workdir: str | Path) -> str:
    """LABKIT_PG_DSN if set, else a SQLite file in ``workdir``."""
    dsn = settings.current().pg_dsn
    return dsn or f"sqlite:///{Path(workdir).resolve() / 'sink.db'}"


class Database:
    """One connection; ``with db.transaction():`` groups statements atomically."""

    def __init__(self, url: str):
        self.url = url
        if url.startswith("sqlite:///"):
            self.kind = "sqlite"
            # isolation_level=None: no implicit transactions, we say BEGIN/COMMIT ourselves.
            self._conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None,
                                         timeout=30)
        elif url.startswith(("postgresql://", "postgres://")):
            try:
                import psycopg
            except ImportError:  # pragma: no cover - psycopg is a lab dependency
                raise RuntimeError("PostgreSQL needs psycopg: pip install 'psycopg[binary]'") from None
            self.kind = "postgresql"
            self._conn = psycopg.connect(url, autocommit=True)
        else:
            raise ValueError(f"unsupported database url {url!r}: use sqlite:///path/to/file.db "
                             "or postgresql://user@host:port/dbname")

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.kind == "postgresql" else sql

    @contextmanager
    def transaction(self) -> Iterator["Database"]:
        """BEGIN ... COMMIT, or ROLLBACK if the block raises."""
        # IMMEDIATE takes SQLite's write lock up front, as PostgreSQL row locks would.
        self._conn.execute("BEGIN IMMEDIATE" if self.kind == "sqlite" else "BEGIN")
        try:
            yield self
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def sequence_column(self, name: str) -> str:
        """DDL for a column the database numbers itself, in insertion order: the order an
        audit may judge, unlike any number the writer supplies. One writer at a time here,
        so insertion order is commit order; a rolled-back insert only leaves a gap."""
        if self.kind == "sqlite":  # AUTOINCREMENT: numbers only grow, even after deletes
            return f"{name} INTEGER PRIMARY KEY AUTOINCREMENT"
        return f"{name} BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"

    def execute(self, sql: str, params: Sequence = ()) -> None:
        self._conn.execute(self._sql(sql), tuple(params))

    def executemany(self, sql: str, rows: Sequence[Sequence]) -> None:
        if rows:
            self._conn.cursor().executemany(self._sql(sql), [tuple(r) for r in rows])

    def query(self, sql: str, params: Sequence = ()) -> list[tuple]:
        cur = self._conn.cursor()
        cur.execute(self._sql(sql), tuple(params))
        return [tuple(r) for r in cur.fetchall()]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
