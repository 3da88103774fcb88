"""The Spark lesson's parts: checkpoint identity, the transactional sink's offset check on a
real database, scenario validation, the run picture; and the optimistic check catching a
checkpoint replay with real Spark."""
from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

from labkit.checking import audit

from labkit.kafka import topics

from labkit.pipelines import data
from labkit.spark import checkpoint as ckpt
from labkit.spark import check
from labkit.storage.db import Database
from labkit.spark.runner import SparkWorker, StreamJob
from labkit.spark.supervised import run_until_done
from labkit.spark.scenarios import PIPELINES, validate
from labkit.spark.sinks import OffsetGap, SinkSpec, create_tables, stored_offsets, write_batch
from labkit.spark.view import batch_spans, live_log, plot_run


def _rows(topic: str, part: int, offsets: range) -> list[dict]:
    return [{"id": f"r-{part}-{o}", "key": "k", "value": "{}", "topic": topic, "partition": part,
             "offset": o} for o in offsets]


# ---------------------------------------------------------------- checkpoint identity


def test_checkpoint_of_another_query_is_refused(tmp_path):
    ckpt.claim(tmp_path / "ck", "orders", "orders-in")
    ckpt.claim(tmp_path / "ck", "orders", "orders-in")  # the same query may resume
    with pytest.raises(ckpt.StaleCheckpoint, match="belongs to query 'orders' reading topic 'orders-in'"):
        ckpt.claim(tmp_path / "ck", "orders", "payments-in")
    with pytest.raises(ckpt.StaleCheckpoint, match="rm -r"):
        ckpt.claim(tmp_path / "ck", "refunds", "orders-in")


def test_foreign_checkpoint_without_identity_is_refused(tmp_path):
    (tmp_path / "ck" / "offsets").mkdir(parents=True)
    with pytest.raises(ckpt.StaleCheckpoint, match="no labkit-query.json"):
        ckpt.claim(tmp_path / "ck", "orders", "orders-in")


def test_runner_refuses_stale_checkpoint_before_starting_spark(tmp_path):
    ckpt.claim(tmp_path / "ck", "orders", "orders-in")
    job = StreamJob(query="orders", topic="other-topic", bootstrap="127.0.0.1:1",
                    checkpoint=str(tmp_path / "ck"),
                    sink=SinkSpec("naive", db_url=f"sqlite:///{tmp_path}/s.db"))
    with pytest.raises(ckpt.StaleCheckpoint, match="other-topic"):
        run_until_done(job)


def test_checkpoint_reader_parses_spark_log_files(tmp_path):
    # The exact layout Spark 4 writes (version line, batch metadata, one line per source).
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
    (tmp_path / "offsets" / "0").write_text(f'v1\n{meta}\n{{"in":{{"1":9,"0":11}}}}')
    (tmp_path / "offsets" / "1").write_text(f'v1\n{meta}\n{{"in":{{"1":18,"0":22}}}}')
    (tmp_path / "offsets" / ".1.crc").write_text("junk")
    (tmp_path / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    frame = ckpt.batches(tmp_path)
    assert frame.values.tolist() == [[0, "in", 0, 0, 11, 11, True], [0, "in", 1, 0, 9, 9, True],
                                     [1, "in", 0, 11, 22, 11, False], [1, "in", 1, 9, 18, 9, False]]


# ------------------------------------------------------- transactional sink, real SQLite


def test_transactional_sink_applies_skips_replays_and_refuses_gaps(tmp_path):
    spec = SinkSpec("transactional", db_url=f"sqlite:///{tmp_path}/t.db", table="t")
    create_tables(spec)
    first = write_batch(spec, None, _rows("in", 0, range(0, 5)), 0, "")
    assert first["applied"] == ["in/0:0-5"] and stored_offsets(spec) == {("in", 0): 5}
    replay = write_batch(spec, None, _rows("in", 0, range(0, 5)), 0, "")
    assert replay["skipped"] == ["in/0:0-5"] and replay["written"] == 0
    with pytest.raises(OffsetGap, match="database is at offset 5"):
        write_batch(spec, None, _rows("in", 0, range(8, 12)), 1, "")
    # the refused batch was rolled back: rows and offsets are as after the first batch
    assert len(check.table_records(spec.db_url, "t")) == 5 and stored_offsets(spec) == {("in", 0): 5}


def test_idempotent_sink_needs_a_primary_key_the_naive_one_has_none(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    for kind in ("naive", "idempotent"):
        spec = SinkSpec(kind, db_url=url, table=kind)
        create_tables(spec)
        for _ in range(2):
            write_batch(spec, None, _rows("in", 0, range(3)), 0, "")
    assert len(check.table_records(url, "naive")) == 6
    assert len(check.table_records(url, "idempotent")) == 3
    with Database(url) as db:
        assert db.query("SELECT COUNT(DISTINCT id) FROM naive") == [(3,)]


def _audited_order(url: str, table: str, offsets: range) -> audit.AuditReport:
    inputs = [{"id": f"r-0-{o}", "key": "k"} for o in offsets]
    return check.audit_output("t", "exactly_once", None, inputs, check.table_records(url, table),
                              audit.expected_counts(inputs))


def test_record_tables_are_read_in_the_databases_own_order_not_by_batch_id(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    spec = SinkSpec("transactional", db_url=url, table="t")
    create_tables(spec)
    write_batch(spec, None, _rows("in", 0, range(0, 5)), 0, "")
    write_batch(spec, None, _rows("in", 0, range(5, 10)), 1, "")
    # resumed from the database's offsets with a new checkpoint: batch ids start again at 0
    write_batch(spec, None, _rows("in", 0, range(10, 15)), 0, "")
    report = _audited_order(url, "t", range(15))
    assert list(check.table_records(url, "t")["kafka_offset"]) == list(range(15))
    assert report.reordered == 0 and report.verdict == "exactly once"


def test_a_real_reorder_in_a_table_is_caught_and_an_upsert_keeps_the_first_position(tmp_path):
    url = f"sqlite:///{tmp_path}/r.db"
    naive, idem = (SinkSpec(kind, db_url=url, table=kind) for kind in ("naive", "idempotent"))
    create_tables(naive)
    create_tables(idem)
    # later input written first, with *increasing* batch ids: only the table's order shows it
    write_batch(naive, None, _rows("in", 0, range(5, 10)), 0, "")
    write_batch(naive, None, _rows("in", 0, range(0, 5)), 1, "")
    report = _audited_order(url, "naive", range(10))
    assert (report.reordered, report.lost, report.duplicated) == (5, 0, 0)
    assert report.verdict == "incorrect" and report.anomalies == ["non-monotonic"]
    for batch_id, offsets in enumerate([range(0, 3), range(3, 6), range(0, 3)]):  # a replay
        write_batch(idem, None, _rows("in", 0, offsets), batch_id, "")
    assert list(check.table_records(url, "idempotent")["kafka_offset"]) == list(range(6))
    assert _audited_order(url, "idempotent", range(6)).exactly_once


def test_sink_spec_rejects_bad_input():
    with pytest.raises(ValueError, match="valid sinks: naive, idempotent"):
        SinkSpec("upsert", db_url="sqlite:///x.db")
    with pytest.raises(ValueError, match="needs output_topic"):
        SinkSpec("kafka")
    with pytest.raises(ValueError, match="needs db_url"):
        SinkSpec("naive")


# ------------------------------------------------------------------ scenario contract


def test_scenario_registry_and_validation():
    assert set(PIPELINES) >= {"spark-naive", "spark-idempotent", "spark-transactional",
                                    "spark-kafka-sink", "spark-running-count",
                                    "spark-txn-input", "spark-txn-input-default"}
    assert validate("spark-kafka-sink", "exactly_once", None, 60) == "kafka"
    assert validate("spark-running-count", "at_least_once", None, 60) == "increment-count"
    with pytest.raises(ValueError, match="runs with guarantee at_least_once, not 'exactly_once'"):
        validate("spark-naive", "exactly_once", None, 60)
    with pytest.raises(ValueError, match="spark-mid-sink, spark-after-sink-before-commit"):
        validate("spark-naive", "at_least_once", "after-commit", 60)
    with pytest.raises(ValueError, match="valid: spark-naive"):
        validate("spark-upsert", "exactly_once", None, 60)
    with pytest.raises(ValueError, match="at least 3"):
        validate("spark-naive", "at_least_once", None, 2)


# ------------------------------------------------- the optimistic check, with real Spark


@pytest.mark.spark
def test_optimistic_offset_check_rolls_back_a_checkpoint_replay(bootstrap, tmp_path):
    """Restart from the CHECKPOINT (not the database): Spark replays batch 1, the sink sees
    the database already past it, rolls the transaction back and the batch is skipped."""
    topic = f"tx-replay-{uuid.uuid4().hex[:8]}"
    inputs = data.generate(60, seed=0)
    data.load_into_topic(bootstrap, topic, inputs, partitions=2)
    spec = SinkSpec("transactional", db_url=f"sqlite:///{tmp_path}/s.db", table="results")
    job = StreamJob(query="tx", topic=topic, bootstrap=bootstrap, checkpoint=str(tmp_path / "ck"),
                    sink=spec, max_offsets_per_trigger=20)
    widget, on_event = live_log()
    run = run_until_done(job, "spark-after-sink-before-commit", hit=2, log_dir=tmp_path,
                         on_event=on_event)
    assert "killed at spark-after-sink-before-commit" in widget.value
    assert "skipped replay" in widget.value
    timeline = run.timeline
    replay = timeline[timeline["replay"]]
    assert list(replay["batch_id"]) == [1]
    planned = run.attempts[0].checkpoint.query("batch_id == 1")  # batch 1's offset ranges
    assert replay["skipped"].iloc[0] == ", ".join(
        f"{topic}/{r.partition}:{r.start_offset}-{r.end_offset}" for r in planned.itertuples())
    report = check.audit_output("tx", "exactly_once", None, inputs,
                                check.table_records(spec.db_url, "results"),
                                audit.expected_counts(inputs))
    assert (report.lost, report.duplicated) == (0, 0) and report.exactly_once
    assert stored_offsets(spec) == {(topic, p): e for p, e in
                                    run.attempts[-1].checkpoint.groupby("partition")["end_offset"].max().items()}
    # the picture: attempt 1 left batch 1 uncommitted, attempt 2 replayed it
    spans = batch_spans(run)
    assert spans[["attempt", "batch_id", "outcome", "replay"]].values.tolist() == [
        [1, 0, "committed", False], [1, 1, "sink done, crashed before commit", False],
        [2, 1, "committed", True], [2, 2, "committed", False]]
    plot_run(run, tmp_path / "run.png")
    assert (tmp_path / "run.png").stat().st_size > 5000
    assert topics.partitions_of(bootstrap, topic) == [0, 1]


@pytest.mark.spark
def test_closing_a_worker_that_is_still_starting_leaves_no_jvm():
    worker = SparkWorker().spawn()
    deadline = time.monotonic() + 60
    while worker._find_jvm() is None:  # wait until its JVM has been launched
        assert time.monotonic() < deadline and worker.alive
        time.sleep(0.1)
    worker.close()
    found = subprocess.run(["pgrep", "-f", f"labkit.worker={worker.tag}"], capture_output=True)
    assert found.returncode == 1, found.stdout  # 1: no process matched


@pytest.mark.spark
def test_a_worker_whose_jvm_never_gets_ready_is_killed_with_its_jvm(tmp_path, monkeypatch):
    # The driver JVM really starts, then waits for a debugger that never comes (JDWP,
    # suspend=y): it never opens its gateway, so the worker never says "ready". Suspended,
    # it does not even read the EOF on its stdin that ends a normal JVM with its worker:
    # before, the failed wait left both the worker and this JVM running.
    from labkit import proc

    monkeypatch.setenv("LABKIT_SPARK_JAVA_OPTS",
                       "-agentlib:jdwp=transport=dt_socket,server=y,suspend=y,address=127.0.0.1:0")
    worker = SparkWorker(log_dir=tmp_path).spawn()
    log = tmp_path / f"worker-{worker.tag}.log"
    deadline = time.monotonic() + 120
    while "Listening for transport dt_socket" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline and worker.alive, log.read_text(errors="replace")
        time.sleep(0.2)  # the JVM has started and stopped at its first instruction
    tree = [(p.pid, p.create_time()) for p in [*proc.descendants(worker.proc),
                                                 *proc.find(f"labkit.worker={worker.tag}")]]
    assert any("SparkSubmit" in (proc.command_line(proc.process(pid)) or "") for pid, _ in tree)
    with pytest.raises(TimeoutError):
        worker.wait_ready(timeout_s=2)
    assert worker.proc is None and worker.returncode == -9  # the worker: SIGKILLed, reaped
    assert not proc.find(f"labkit.worker={worker.tag}")
    assert not [pid for pid, started in tree if proc.alive(pid, started)]
