"""The system beside Kafka, as a part of an experiment (Jepsen's ``:db``): set up by the
runner before the clients start, torn down after the checkers read it, also after a failure.

    db=lambda o: Schema(tables=make_tables, keep=o.keep_database)     # a PostgreSQL schema
    db=lambda o: ConnectedSchema(...)                                 # plus a Connect worker

``run.db`` is the part while the run lasts: the clients and checkers read what they need of
it (``run.db.dsn``), the process faults may kill what it runs (a Connect worker).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from labkit.storage import postgres


class Db(Protocol):
    def setup(self, run: Any) -> None: ...

    def teardown(self, run: Any) -> None: ...


class Schema:
    """A PostgreSQL schema of the run's own on the lab's server (``postgres.ensure()``),
    named after the run; ``tables(run, dsn)`` makes its tables and says which (the
    timeline's line). Dropped after the run unless ``keep``."""

    def __init__(self, tables: Callable[[Any, str], str], keep: bool = False):
        self.tables, self.keep = tables, keep
        self.name = self.dsn = self.server = ""

    def setup(self, run: Any) -> None:
        self.name, self.server = postgres.name_for(run.base), postgres.ensure()
        self.dsn = postgres.fresh_schema(self.name, self.server)
        made = self.tables(run, self.dsn)
        run.step(f"PostgreSQL schema {self.name}: {made}")

    def teardown(self, run: Any) -> None:
        if self.name and not self.keep:
            postgres.drop_schema(self.name, self.server)


def owned(run: Any, db: Db) -> None:
    """``db`` set up for ``run`` and torn down when the run closes (after its checkers),
    also when its set-up fails half way."""
    run.db = db
    run.on_close(lambda: db.teardown(run))
    db.setup(run)
