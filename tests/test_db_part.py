"""The system beside Kafka is a part of an experiment (labkit.experiments.db, Jepsen's :db):
the runner sets it up before the clients and tears it down after the checkers, also when
its set-up fails half way; no client makes or drops a schema of its own."""
import ast
import uuid
from pathlib import Path

import pytest

from labkit.experiments.context import RunContext
from labkit.experiments.db import Schema, owned
from labkit.experiments.registry import catalog
from labkit.storage import postgres
from labkit.storage.db import Database

ROOT = Path(__file__).parents[1]
BESIDE_KAFKA = ("dual-write", "kafka-to-database", "outbox")


def _schemas(dsn: str) -> set[str]:
    with Database(dsn, readonly=True) as db:
        return {name for (name,) in db.query("SELECT schema_name FROM information_schema.schemata")}


def test_the_experiments_beside_kafka_have_a_db_part_and_no_client_makes_a_schema():
    experiments = catalog()
    assert all(experiments[name].db is not None for name in BESIDE_KAFKA)
    makers = {"fresh_schema", "drop_schema", "fresh_database", "drop_database"}
    calls = [f"{path.name}:{node.lineno}"
             for path in sorted((ROOT / "labkit" / "experiments").glob("*.py"))
             if path.name not in ("db.py", "outbox.py")  # the parts themselves
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Attribute) and node.attr in makers]
    assert not calls, calls


def test_a_schema_whose_setup_fails_is_dropped_when_the_run_closes(pg_dsn, monkeypatch):
    monkeypatch.setenv("LABKIT_PG_DSN", pg_dsn)
    run = RunContext("db-part-test", {})
    run.base = f"db-part-{uuid.uuid4().hex[:8]}"
    name = postgres.name_for(run.base)

    def tables(run, dsn: str) -> str:
        with Database(dsn) as db:
            db.execute("CREATE TABLE payments (id text PRIMARY KEY)")
        assert name in _schemas(pg_dsn)  # made, with its table, before the clients
        raise RuntimeError("the second table could not be made")

    with pytest.raises(RuntimeError, match="second table"):
        owned(run, Schema(tables))
    assert name in _schemas(pg_dsn)  # still there until the run closes: a checker may read it
    run.close(failed=True)
    assert name not in _schemas(pg_dsn)


def test_a_kept_schema_stays_after_the_run(pg_dsn, monkeypatch):
    monkeypatch.setenv("LABKIT_PG_DSN", pg_dsn)
    run = RunContext("db-part-test", {})
    run.base = f"db-part-{uuid.uuid4().hex[:8]}"
    name = postgres.name_for(run.base)
    owned(run, Schema(lambda run, dsn: "no tables", keep=True))
    run.close()
    try:
        assert name in _schemas(pg_dsn)
        assert run.steps[-1].what == f"PostgreSQL schema {name}: no tables"
    finally:
        postgres.drop_schema(name, pg_dsn)
