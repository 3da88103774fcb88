"""Spark reading a topic written in transactions, some of them aborted (issue 13, item 2).

The input comes from the lab's exactly-once producer (labkit.pipelines.txn): transactions of
5 records, every 3rd aborted, so the log holds aborted records and a COMMIT/ABORT marker per
partition per transaction. Spark's Kafka source reads with the Java client's default,
read_uncommitted, unless told otherwise: the aborted records reach the sink. With
kafka.isolation.level=read_committed they do not, and the offsets a batch covers have gaps
(markers, aborted batches) that the transactional sink must accept: it stores Spark's own
range ends from the checkpoint, not the last row's offset + 1.

The two Spark runs (the default isolation reads the 20 aborted records; read_committed,
crashed and restarted, is exact and stores each partition's high watermark, past the last
row + 1) run once, in notebook 08b (section 3), whose compared output is the check. They
ran here a second time until the suite had to fit its 30 minutes.
"""
from __future__ import annotations

import pytest

from labkit.spark import check
from labkit.spark.sinks import OffsetGap, SinkSpec, create_tables, stored_offsets, write_batch


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
