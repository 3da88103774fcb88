"""The database sinks on PostgreSQL (psycopg 3): LABKIT_PG_DSN's server if set, else the
lab's own, which conftest.py starts once per test process (labkit.storage.postgres)."""
from __future__ import annotations

import uuid

import pytest

from labkit import experiments
from labkit.spark.sinks import OffsetGap, SinkSpec, create_tables, stored_offsets, write_batch
from labkit.storage.db import Database

ENV_DSN = "LABKIT_PG_DSN"


def _rows(part: int, offsets: range) -> list[dict]:
    return [{"id": f"r-{o}", "key": "k", "value": "{}", "topic": "in", "partition": part,
             "offset": o} for o in offsets]


def test_transactional_sink_offset_check_on_postgres(pg_dsn):
    spec = SinkSpec("transactional", db_url=pg_dsn, table=f"t_{uuid.uuid4().hex[:8]}")
    create_tables(spec)
    assert write_batch(spec, None, _rows(0, range(0, 4)), 0, "")["applied"] == ["in/0:0-4"]
    assert write_batch(spec, None, _rows(0, range(0, 4)), 0, "")["skipped"] == ["in/0:0-4"]
    with pytest.raises(OffsetGap):
        write_batch(spec, None, _rows(0, range(6, 9)), 1, "")
    with Database(pg_dsn) as db:
        assert db.query(f"SELECT COUNT(*) FROM {spec.table}") == [(4,)]
    assert stored_offsets(spec) == {("in", 0): 4}


def test_record_tables_are_read_in_the_databases_own_order_on_postgres(pg_dsn):
    """The identity column numbers rows as inserted: a restart's batch ids start again at
    0, its rows still read last; an upsert of a replayed row keeps the row's first place."""
    from labkit.spark.check import table_records

    txn = SinkSpec("transactional", db_url=pg_dsn, table=f"t_{uuid.uuid4().hex[:8]}")
    idem = SinkSpec("idempotent", db_url=pg_dsn, table=f"i_{uuid.uuid4().hex[:8]}")
    for spec, batches in ((txn, [(0, range(0, 5)), (1, range(5, 10)), (0, range(10, 15))]),
                          (idem, [(0, range(0, 5)), (1, range(5, 10)), (2, range(0, 5))])):
        create_tables(spec)
        for batch_id, offsets in batches:
            write_batch(spec, None, _rows(0, offsets), batch_id, "")
    assert list(table_records(pg_dsn, txn.table)["kafka_offset"]) == list(range(15))
    assert list(table_records(pg_dsn, idem.table)["kafka_offset"]) == list(range(10))


@pytest.mark.spark
@pytest.mark.parametrize("name, guarantee, duplicated", [
    ("spark-naive", "at_least_once", 20),
    ("spark-transactional", "exactly_once", 0),
])
def test_spark_sinks_on_postgres(bootstrap, tmp_path, monkeypatch, pg_dsn, name, guarantee,
                                 duplicated):
    monkeypatch.setenv(ENV_DSN, pg_dsn)
    exp = experiments.run(name, cluster=bootstrap, guarantee=guarantee,
                          crash_at="spark-after-sink-before-commit",
                          records=60, workdir=tmp_path)
    assert exp.job.sink.db_url == pg_dsn
    r = exp.report
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated) == (60, 60, 0, duplicated)
    assert r.reordered == 0  # judged from the identity column, not from batch ids
