"""The audit: Jepsen-style findings from what is observable afterwards."""
from __future__ import annotations

import ast
import json
import sqlite3
from pathlib import Path

import pytest
from confluent_kafka import Producer

import labkit.audit
from labkit import data, topics
from labkit.audit import REPORT_KEYS, Delivered, audit_table, audit_topic, check, expected_counts


def inputs(n: int = 6) -> list[dict]:
    keys = ["a", "b", "a", "b", "a", "b", "a", "b"]
    return [{"id": f"x{i}", "key": keys[i]} for i in range(n)]


def seen(*ids: str) -> list[Delivered]:
    key = {r["id"]: r["key"] for r in inputs(8)}
    return [Delivered(i, key.get(i)) for i in ids]


def test_exact_delivery_is_exactly_once():
    report = check("s", "exactly_once", inputs(), seen("x0", "x1", "x2", "x3", "x4", "x5"))
    assert (report.lost, report.duplicated, report.reordered, report.delivered_unique) == (0, 0, 0, 6)
    assert report.exactly_once and report.examples == {}


def test_lost_duplicated_and_reordered_are_counted_with_examples():
    # x1 lost; x2 delivered three times; per key 'a', x4 arrives before x2 (non-monotonic).
    report = check("s", "at_least_once", inputs(),
                   seen("x0", "x4", "x2", "x3", "x2", "x5", "x2"))
    assert report.lost == 1 and report.examples["lost"] == ["x1"]
    assert report.duplicated == 2 and report.examples["duplicated"] == ["x2"]
    assert report.reordered == 1 and report.examples["reordered"] == ["x2"]
    assert report.delivered_unique == 5
    assert not report.exactly_once


def test_a_replayed_batch_is_duplicated_not_reordered():
    report = check("s", "at_least_once", inputs(), seen("x0", "x1", "x2", "x3", "x2", "x3", "x4", "x5"))
    assert (report.duplicated, report.reordered) == (2, 0)


def test_ids_that_never_went_in_are_flagged_and_inputs_must_be_unique():
    report = check("s", "at_least_once", inputs(2), [*seen("x0", "x1"), Delivered("zz", "a")])
    assert report.examples["unexpected"] == ["zz"] and report.delivered_unique == 2
    with pytest.raises(ValueError, match="unique"):
        check("s", "at_least_once", [{"id": "a", "key": 1}, {"id": "a", "key": 1}], [])


def test_state_drift_names_the_keys():
    report = check("s", "at_least_once", inputs(), seen("x0", "x1", "x2", "x3", "x4", "x5"),
                   state_expected={"a": 3, "b": 3}, state_actual={"a": 4, "b": 3})
    assert not report.state_matches and not report.exactly_once
    assert report.examples["state_drift"] == ["a"]
    assert expected_counts(inputs()) == {"a": 3, "b": 3}


def test_report_json_has_exactly_the_contract_keys():
    report = check("s", "exactly_once", inputs(), seen("x0"))
    assert list(json.loads(report.to_json())) == list(REPORT_KEYS)


def test_report_is_one_dataframe_row_with_the_same_values():
    report = check("s", "at_least_once", inputs(), seen("x0", "x0", "x1"),
                   state_expected={"a": 2}, state_actual={"a": 3})
    frame = report.to_frame()
    assert list(frame.columns) == list(REPORT_KEYS) and len(frame) == 1
    row = frame.iloc[0]
    assert (row["produced"], row["lost"], row["duplicated"]) == (6, 4, 1)
    assert json.loads(row["state_actual"]) == {"a": 3}  # dicts kept as JSON text in a cell


def test_topic_audit_sees_aborted_records_only_when_reading_uncommitted(bootstrap, topic_name):
    records = data.generate(20)
    topics.create(bootstrap, topic_name)
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for r in records[:10] + records[8:10]:  # two duplicates
        plain.produce(topic_name, key=r["key"].encode(), value=topics.encode(r))
    plain.flush(10)
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic_name}-tx"})
    txn.init_transactions()
    txn.begin_transaction()
    for r in records[10:15]:  # aborted: a correct read_committed reader never sees them
        txn.produce(topic_name, key=r["key"].encode(), value=topics.encode(r))
    txn.flush(10)
    txn.abort_transaction()
    txn.begin_transaction()
    for r in records[10:20]:
        txn.produce(topic_name, key=r["key"].encode(), value=topics.encode(r))
    txn.commit_transaction()

    committed = audit_topic(bootstrap, topic_name, records, "t", "exactly_once")
    assert (committed.lost, committed.duplicated, committed.aborted_visible) == (0, 2, 0)
    dirty = audit_topic(bootstrap, topic_name, records, "t", "exactly_once",
                        isolation="read_uncommitted")
    assert dirty.aborted_visible == 5 and dirty.duplicated == 7
    assert dirty.examples["aborted_visible"] == [r["id"] for r in records[10:15]]


def test_topic_audit_compares_the_last_count_per_key(bootstrap, topic_name):
    records = [{"id": f"c{i}", "key": k} for i, k in enumerate("aabab")]
    topics.create(bootstrap, topic_name)
    p = Producer({"bootstrap.servers": bootstrap})
    counts: dict[str, int] = {}
    for r in records:
        counts[r["key"]] = counts.get(r["key"], 0) + 1 + (r["id"] == "c4")  # c4 over-counts
        p.produce(topic_name, key=r["key"].encode(),
                  value=topics.encode({"id": r["id"], "key": r["key"], "count": counts[r["key"]]}))
    p.flush(10)
    report = audit_topic(bootstrap, topic_name, records, "t", "at_least_once", state_field="count")
    assert report.state_expected == {"a": 3, "b": 2}
    assert report.state_actual == {"a": 3, "b": 3}
    assert report.examples["state_drift"] == ["b"]


def test_table_audit_reads_rows_in_insertion_order(tmp_path):
    db_path = tmp_path / "sink.db"
    with sqlite3.connect(db_path) as db:
        db.execute("CREATE TABLE sink (id TEXT, key TEXT)")
        db.executemany("INSERT INTO sink VALUES (?, ?)",
                       [("x0", "a"), ("x2", "a"), ("x1", "b"), ("x2", "a")])
    report = audit_table(str(db_path), "sink", inputs(4), "t", "at_least_once")
    assert (report.lost, report.duplicated, report.reordered) == (1, 1, 0)
    assert report.examples["lost"] == ["x3"]


def test_the_audit_never_imports_pipelines_or_faults():
    tree = ast.parse(Path(labkit.audit.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith(("labkit.pipelines", "labkit.faults",
                                                            "labkit.scenarios"))}
