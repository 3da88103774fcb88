"""Spark reading a topic written in transactions, some of them aborted (issue 13, item 2).

The input comes from the lab's exactly-once producer (labkit.pipelines.txn): transactions of
5 records, every 3rd aborted, so the log holds aborted records and a COMMIT/ABORT marker per
partition per transaction. Spark's Kafka source reads with the Java client's default,
read_uncommitted, unless told otherwise: the aborted records reach the sink. With
kafka.isolation.level=read_committed they do not, and the offsets a batch covers have gaps
(markers, aborted batches). The scenarios' sink is the batch-id sink (rows and batch id in
one transaction: it needs no offset at all); the lab's offset-keeping transactional sink
(08a's) must accept the gaps: it stores Spark's own range ends, which the lab reads from the
checkpoint, not the last row's offset + 1.

The two Spark runs (the default isolation reads the 20 aborted records; read_committed,
crashed and restarted, is exact) run once, in notebook 08b (section 3), whose compared
output is the check; its ledger_sink, with and without its batch id check, runs in
tests/test_spark_learner_code.py.
"""
from __future__ import annotations

import pytest

from labkit.spark import check
from labkit.spark.sinks import (OffsetGap, SinkSpec, create_tables, recorded_batches,
                                stored_offsets, write_batch)


def _rows(part: int, offsets) -> list[dict]:
    return [{"id": f"r-{part}-{o}", "key": "k", "value": "{}", "topic": "in", "partition": part,
             "offset": o} for o in offsets]


def test_transactional_sink_stores_sparks_range_ends_across_gaps(tmp_path):
    """No Spark here: the sink alone, fed what Spark hands a read_committed batch."""
    spec = SinkSpec("transactional", db_url=f"sqlite:///{tmp_path}/t.db", table="t")
    create_tables(spec)
    # offsets 0-4 committed, 5 its marker, 6-10 aborted, 11 that marker, 12-14 committed, 15 marker
    batch0 = _rows(0, [0, 1, 2, 3, 4, 12, 13])
    assert write_batch(spec, None, batch0, 0, "", ranges={("in", 0): (0, 14)})["applied"] == ["in/0:0-14"]
    assert stored_offsets(spec) == {("in", 0): 14}
    # the next batch starts where Spark's range ended, though its first row is at 14 and
    # its range ends after a marker no row shows; a partition with nothing new is left alone
    nxt = write_batch(spec, None, _rows(0, [14]), 1, "", ranges={("in", 0): (14, 16), ("in", 1): (0, 0)})
    assert nxt["applied"] == ["in/0:14-16"] and stored_offsets(spec) == {("in", 0): 16}
    # a range of only aborted records and markers still moves the stored offset
    write_batch(spec, None, [], 2, "", ranges={("in", 0): (16, 23)})
    assert stored_offsets(spec) == {("in", 0): 23}
    # a replay of an applied range is skipped, as before
    assert write_batch(spec, None, batch0, 0, "", ranges={("in", 0): (0, 14)})["written"] == 0
    assert len(check.table_records(spec.db_url, "t")) == 8
    # Without Spark's ranges the sink can only guess from the rows (last offset + 1 = 14,
    # not 16): the next batch's range then looks like a gap and is refused.
    guess = SinkSpec("transactional", db_url=f"sqlite:///{tmp_path}/g.db", table="g")
    create_tables(guess)
    write_batch(guess, None, _rows(0, [0, 1, 2, 3, 4, 12, 13]), 0, "")
    write_batch(guess, None, _rows(0, [14]), 1, "")
    with pytest.raises(OffsetGap, match="database is at offset 15"):
        write_batch(guess, None, _rows(0, [17, 18]), 2, "")


def test_batch_id_sink_skips_an_id_it_recorded_in_the_same_transaction(tmp_path):
    """No Spark here: the lab's batch-id sink fed batches 0 and 1, then batch 1 again (a
    replay), then batch 2 whose write the database rolls back (a failure before its commit)."""
    spec = SinkSpec("batch-id", db_url=f"sqlite:///{tmp_path}/b.db", table="b")
    create_tables(spec)
    assert write_batch(spec, None, _rows(0, [0, 1, 2]), 0, "")["written"] == 3
    assert write_batch(spec, None, _rows(0, [4, 5]), 1, "")["written"] == 2
    replay = write_batch(spec, None, _rows(0, [4, 5]), 1, "")
    assert replay == {"written": 0, "skipped": ["batch 1"]}
    # the second half's row cannot be stored: the first half, written, is rolled back too
    unstorable = {**_rows(0, [8])[0], "value": {"a dict": "SQLite cannot bind"}}
    with pytest.raises(Exception, match="not supported|bind"):
        write_batch(spec, None, _rows(0, [7]) + [unstorable], 2, "")
    assert recorded_batches(spec) == [0, 1]  # batch 2's id went with its rows
    assert list(check.table_records(spec.db_url, "b")["kafka_offset"]) == [0, 1, 2, 4, 5]
