"""The audit: Jepsen-style findings from what is observable afterwards."""
from __future__ import annotations

import ast
import json
import sqlite3
from pathlib import Path

import pytest
from confluent_kafka import Producer

import labkit.checking.audit
from labkit.checking import checkers
from labkit.kafka import topics
from labkit.pipelines import data
from labkit.checking.audit import (REPORT_KEYS, AuditReport, Delivered, audit_table, audit_topic, check,
                          check_counts, expected_counts)
from labkit.checking.checkers import Result


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


# --------------------------------------------------------------------------- the checkers


def test_lost_write_names_the_missing_input_ids_in_input_order():
    r = checkers.lost_write(["x0", "x1", "x2", "x3"], ["x3", "x0", "zz"])
    assert (r.name, r.valid, r.count, r.examples) == ("lost-write", False, 2, ["x1", "x2"])
    assert checkers.lost_write(["x0"], ["x0", "x0"]).valid


def test_duplicate_counts_every_extra_copy():
    r = checkers.duplicate(["x0", "x1", "x2"], ["x2", "x0", "x2", "x0", "x2", "x1"])
    assert (r.valid, r.count, r.examples) == (False, 3, ["x0", "x2"])
    assert checkers.duplicate(["x0", "x1"], ["x1", "x0"]) == Result("duplicate", True, 0, [])


def test_aborted_read_counts_what_the_reader_saw_of_aborted_transactions():
    assert checkers.aborted_read(["x3", "x4"]) == Result("aborted-read", False, 2, ["x3", "x4"])
    assert checkers.aborted_read([]).valid


def test_non_monotonic_is_per_key_and_ignores_replayed_copies():
    ids = [r["id"] for r in inputs()]  # keys a b a b a b
    # x4 (a) before x2 (a): x2 is reordered; x3 (b) after x1 (b) is fine, the replay of x0 too
    r = checkers.non_monotonic(ids, seen("x0", "x1", "x4", "x3", "x2", "x0", "x5"))
    assert (r.name, r.count, r.examples) == ("non-monotonic", 1, ["x2"])
    # interleaving two keys is not a reorder: only the order within a key counts
    assert checkers.non_monotonic(ids, seen("x1", "x3", "x5", "x0", "x2", "x4")).valid


def test_state_drift_and_count_sink_checkers():
    assert checkers.state_drift({"a": 3, "b": 2}, {"a": 3, "b": 3}).examples == ["b"]
    assert checkers.state_drift(5, 4) == Result("state-drift", False, 1, ["(total)"])
    assert checkers.state_drift(None, None).valid
    expected, actual = {"a": 3, "b": 2, "c": 1}, {"a": 5, "b": 1}
    assert checkers.count_shortfall(expected, actual) == Result("lost-write", False, 2, ["b: -1", "c: -1"])
    assert checkers.count_excess(expected, actual) == Result("duplicate", False, 2, ["a: +2"])


def test_history_checks_are_a_hook_until_histories_exist():
    assert checkers.history_checks(None) == [] and checkers.history_checks([]) == []
    with pytest.raises(NotImplementedError, match="poll-skip"):
        checkers.history_checks([{"op": "poll", "partition": 0, "offset": 3}])


def _found(*names: str) -> list[Result]:
    every = ("lost-write", "duplicate", "aborted-read", "non-monotonic", "state-drift")
    return [Result(n, n not in names, int(n in names)) for n in every]


@pytest.mark.parametrize("found, verdict", [
    ((), "exactly once"),
    (("duplicate",), "at least once"),
    (("duplicate", "state-drift"), "at least once"),  # the drift is the duplicates' doing
    (("lost-write",), "at most once"),
    (("lost-write", "state-drift"), "at most once"),
    (("lost-write", "duplicate"), "incorrect"),
    (("aborted-read",), "incorrect"),
    (("duplicate", "aborted-read"), "incorrect"),
    (("non-monotonic",), "incorrect"),
    (("state-drift",), "incorrect"),  # records look exactly-once, the state does not
])
def test_one_verdict_composes_the_findings(found, verdict):
    assert checkers.verdict(_found(*found)) == verdict
    assert set(checkers.anomalies(_found(*found))) == set(found)


def test_every_report_is_judged_by_the_one_verdict():
    # a report made by hand (as the Spark probe and the widgets do) gets the same rule
    assert AuditReport("s", "g", produced=3, delivered_unique=3, duplicated=1).verdict == "at least once"
    reordered = check("s", "exactly_once", inputs(), seen("x0", "x1", "x4", "x3", "x2", "x5"))
    assert (reordered.lost, reordered.duplicated, reordered.reordered) == (0, 0, 1)
    assert reordered.verdict == "incorrect" and not reordered.exactly_once
    assert reordered.summary().endswith(
        "verdict: NOT exactly once (non-monotonic): neither at most once nor at least once")
    counts = check_counts("s", "at_least_once", 6, {"a": 3, "b": 3}, {"a": 4, "b": 3})
    assert (counts.lost, counts.duplicated, counts.delivered_unique) == (0, 1, 6)
    assert counts.verdict == "at least once" and counts.anomalies == ["duplicate", "state-drift"]


def test_report_json_has_exactly_the_contract_keys():
    report = check("s", "exactly_once", inputs(), seen("x0"))
    out = json.loads(report.to_json())
    assert list(out) == list(REPORT_KEYS)
    assert list(REPORT_KEYS)[:12] == [  # the original contract, in order; new keys append
        "scenario", "guarantee", "crash_at", "fault", "produced", "delivered_unique", "lost",
        "duplicated", "reordered", "aborted_visible", "state_expected", "state_actual"]
    assert (out["verdict"], out["anomalies"], out["aborted_in_log"]) == (
        "at most once", ["lost-write"], None)  # None: no log was looked at


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
    # The aborted records are in the log all the same: measured, not assumed.
    assert committed.aborted_in_log == 5 and committed.verdict == checkers.AT_LEAST_ONCE
    dirty = audit_topic(bootstrap, topic_name, records, "t", "exactly_once",
                        isolation="read_uncommitted")
    assert dirty.aborted_visible == 5 and dirty.duplicated == 7 and dirty.aborted_in_log == 5
    assert dirty.examples["aborted_visible"] == [r["id"] for r in records[10:15]]
    assert dirty.verdict == checkers.INCORRECT and "aborted-read" in dirty.anomalies


def test_a_crash_inside_a_transaction_leaves_aborted_records_present_but_invisible(
        bootstrap, topic_name):
    """The open transaction of a dead producer is aborted by its successor's init."""
    records = data.generate(8)
    topics.create(bootstrap, topic_name)
    tid = f"{topic_name}-tx"
    dead = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
    dead.init_transactions()
    dead.begin_transaction()
    for r in records[:3]:
        dead.produce(topic_name, key=r["key"].encode(), value=topics.encode(r))
    dead.flush(10)  # in the log, never committed; this producer is never heard of again
    successor = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
    successor.init_transactions()  # fences `dead` and aborts its open transaction
    successor.begin_transaction()
    for r in records:
        successor.produce(topic_name, key=r["key"].encode(), value=topics.encode(r))
    successor.commit_transaction()

    report = audit_topic(bootstrap, topic_name, records, "t", "exactly_once")
    assert (report.aborted_in_log, report.aborted_visible) == (3, 0)
    assert (report.lost, report.duplicated, report.reordered) == (0, 0, 0)
    assert report.exactly_once and report.to_dict()["aborted_in_log"] == 3


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
    tree = ast.parse(Path(labkit.checking.audit.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith(("labkit.pipelines", "labkit.faults",
                                                            "labkit.experiments"))}


@pytest.mark.parametrize("report, sentence, verdict", [
    (AuditReport("s", "exactly_once", crash_at="mid-batch", produced=40, delivered_unique=40),
     "40 in, 40 out, each once: nothing lost, nothing duplicated in this run.",
     "exactly once in this run, under the crash at mid-batch"),
    # a clean run proves nothing about a guarantee it did not put to the test
    (AuditReport("s", "at_least_once", produced=40, delivered_unique=40),
     "40 in, 40 out, each once: nothing lost, nothing duplicated in this run.",
     "no anomaly seen in this run (not a guarantee: no crash point or network fault in this run)"),
    (AuditReport("s", "exactly_once", produced=40, delivered_unique=40),
     "40 in, 40 out, each once: nothing lost, nothing duplicated in this run.",
     "no anomaly seen in this run (not a guarantee: no crash point or network fault in this run)"),
    (AuditReport("s", "at_least_once", fault="reset:produce:11", produced=40, delivered_unique=40),
     "40 in, 40 out, each once: nothing lost, nothing duplicated in this run.",
     "no anomaly seen in this run (not a guarantee: at_least_once does not promise exactly once)"),
    (AuditReport("s", "at_most_once", crash_at="c", produced=40, delivered_unique=30, lost=10),
     "40 in, 30 out: 10 lost, nothing duplicated.",
     "NOT exactly once (lost-write): it behaved as at most once"),
    (AuditReport("s", "at_least_once", crash_at="c", produced=40, delivered_unique=40, duplicated=10,
                 state_expected={"a": 1}, state_actual={"a": 2}),
     "40 in, 40 out: nothing lost, 10 duplicated, the state is off.",
     "NOT exactly once (duplicate, state-drift): it behaved as at least once"),
])
def test_the_summary_says_what_happened_and_claims_no_more(report, sentence, verdict):
    lines = report.summary().splitlines()
    assert lines[1].strip() == sentence and lines[3] == f"  verdict: {verdict}"
    assert lines[2].startswith(f"  produced={report.produced} delivered_unique=")
