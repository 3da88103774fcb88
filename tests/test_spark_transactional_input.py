"""Spark reading a topic written in transactions, some of them aborted (issue 13, item 2).

The input comes from the lab's exactly-once producer (labkit.pipelines.txn): transactions of
5 records, every 3rd aborted, so the log holds aborted records and a COMMIT/ABORT marker per
partition per transaction. Spark's Kafka source reads with the Java client's default,
read_uncommitted, unless told otherwise: the aborted records reach the sink. With
kafka.isolation.level=read_committed they do not, and the offsets a batch covers have gaps
(markers, aborted batches) that the transactional sink must accept: it stores Spark's own
range ends from the checkpoint, not the last row's offset + 1.
"""
from __future__ import annotations

import pytest

from labkit.kafka.inspect import describe_topic
from labkit.spark import check
from labkit import experiments
from labkit.spark.sinks import OffsetGap, SinkSpec, create_tables, stored_offsets, write_batch

RECORDS = 60  # 12 transactions of 5: 8 committed (40 records), 4 aborted (20)


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


@pytest.mark.spark
def test_default_isolation_reads_aborted_records_read_committed_is_exact(bootstrap, tmp_path):
    trap = experiments.run("spark-txn-input-default", cluster=bootstrap,
                           guarantee="exactly_once", crash_at=None,
                           records=RECORDS, workdir=tmp_path / "default")
    r = trap.report
    # Every aborted record reached the table: the rows whose input position a read_committed
    # reader never gets (the input log read both ways, not the producer's own list).
    assert r.produced == 40 and r.aborted_visible == RECORDS - r.produced == 20
    assert (r.lost, r.duplicated) == (0, 0) and len(trap.output) == RECORDS
    assert r.verdict == "incorrect" and "aborted-read" in r.anomalies

    exact = experiments.run("spark-txn-input", cluster=bootstrap,
                            guarantee="exactly_once",
                            crash_at="spark-after-sink-before-commit",
                            records=RECORDS,
                            workdir=tmp_path / "committed", spare=False)
    r = exact.report
    first, second = exact.run.attempts
    assert first.crashed and first.returncode == -9 and not second.crashed
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated, r.aborted_visible,
            r.reordered) == (40, 40, 0, 0, 0, 0)
    assert r.state_matches and r.verdict == "exactly once"
    # The restart began at the database's offsets, and the offsets it ends with are the
    # input's high watermarks: past the last COMMIT marker, which no row shows.
    assert second.starting_offsets.startswith("{")
    ends = {p.partition: p.high_watermark
            for p in describe_topic(bootstrap, exact.job.topic).partitions}
    assert stored_offsets(exact.job.sink) == {(exact.job.topic, p): e for p, e in ends.items()}
    last_rows = exact.output.groupby("kafka_partition")["kafka_offset"].max()
    assert all(last_rows[p] + 1 < e for p, e in ends.items())  # a gap the old sink refused
