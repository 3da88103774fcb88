"""A run is plain data, and can be checked again (issue 50, Jepsen's stored histories): a
live run stored with ``run.store(path)`` and re-checked by ``labkit check PATH`` with no
Kafka reachable gives the live run's verdict, counts and findings; an edited read gives
another verdict (the check reads the stored data); an experiment whose checkers read
something the history does not hold is refused, by name."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from labkit import experiments
from labkit.checking import audit, reads, stored
from labkit.cli import app
from labkit.experiments.recheck import recheck, text
from labkit.experiments import registry
from labkit.experiments.registry import get
from labkit.kafka import topics
from labkit.kafka.topics import Rec
from labkit.storage import db as storage_db
from tests.wrong_loops import judged

LABKIT = Path(sys.executable).with_name("labkit")


@pytest.fixture
def no_kafka():
    """An address nothing answers on (bound, never listening: refused at once)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@contextmanager
def kafka_forbidden(no_kafka: str):
    """In this process: any read of a topic or a table fails, LABKIT_BOOTSTRAP points nowhere
    and LABKIT_PG_DSN at no PostgreSQL."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a re-check read Kafka or a table: {args}")
    with pytest.MonkeyPatch.context() as patch:
        for module, name in ((topics, "read"), (storage_db, "read_table"),
                             (reads, "read_table")):
            patch.setattr(module, name, refuse)
        patch.setenv("LABKIT_BOOTSTRAP", no_kafka)
        patch.setenv("LABKIT_PG_DSN", f"postgresql://lab@{no_kafka}/nowhere")
        yield


def _reads(path: Path, kind: str = "read") -> list[int]:
    lines = path.read_text().splitlines()
    return [n for n, line in enumerate(lines) if json.loads(line).get("kind") == kind]


def checked_again(run, path: Path, no_kafka: str):
    """``labkit check PATH`` and ``recheck`` with no Kafka or database reachable: both give
    the live run's report, its summary line for line; the re-checked record."""
    with kafka_forbidden(no_kafka):
        result = CliRunner().invoke(app, ["check", str(path)])
        again = recheck(stored.load(path))
    assert result.exit_code == 0, result.output
    assert result.output.strip() == run.report.summary().strip()
    assert again.report.to_dict() == run.report.to_dict()
    assert again.report.examples == run.report.examples
    # the facts are the history's observed entries: those that are plain data come back
    plain = {name: json.loads(json.dumps(value)) for name, value in run.facts.items()
             if _plain(value)}
    assert plain, "the run observed no plain fact to store"
    stored_facts = stored.load(path).facts
    assert {name: stored_facts.get(name) for name in plain} == plain
    return again


def _plain(value) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def drop_one_read(path: Path, at: int) -> str:
    """The id of a record the read_committed reader got once, dropped from the stored read
    at line ``at`` (both readers' copies of it)."""
    lines = path.read_text().splitlines()
    entry = json.loads(lines[at])
    ids = [r[3]["id"] for r in entry["records"] if "c" in r[4]]
    once = next(i for i in ids if ids.count(i) == 1)
    entry["records"] = [r for r in entry["records"] if r[3]["id"] != once]
    lines[at] = json.dumps(entry)
    path.write_text("\n".join(lines) + "\n")
    return once


def test_a_stored_consume_transform_produce_run_is_checked_again_offline(
        bootstrap, tmp_path, no_kafka):
    run = experiments.run("consume-transform-produce", cluster=bootstrap,
                          guarantee="at_least_once", crash_at="after-process-before-commit",
                          records=40, keep_topics=False)
    assert (run.report.lost, run.report.duplicated) == (0, 10), run.summary()
    path = run.store(tmp_path / "ctp.jsonl")
    assert len(_reads(path)) == 1  # the audit's one read, both readers in one entry

    # another process, no Kafka anywhere: the live summary, line for line
    out = subprocess.run([str(LABKIT), "check", str(path)], capture_output=True, text=True,
                         env={**os.environ, "LABKIT_BOOTSTRAP": no_kafka}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == run.summary().strip()
    again = recheck(stored.load(path))
    assert again.report.to_dict() == run.report.to_dict()
    assert again.report.examples == run.report.examples

    # one record the audit read, gone from the stored read: lost, so another verdict
    lines = path.read_text().splitlines()
    (at,) = _reads(path)
    entry = json.loads(lines[at])
    ids = [r[3]["id"] for r in entry["records"]]
    once = next(i for i in ids if ids.count(i) == 1)
    entry["records"] = [r for r in entry["records"] if r[3]["id"] != once]
    lines[at] = json.dumps(entry)
    path.write_text("\n".join(lines) + "\n")
    edited = recheck(stored.load(path))
    assert (edited.report.lost, edited.report.duplicated) == (1, 10)
    assert edited.report.examples["lost"] == [once]
    assert "lost-write" in edited.report.anomalies
    assert edited.verdict != run.verdict


def test_a_stored_judge_run_gives_the_same_verdict_and_findings(bootstrap, tmp_path, no_kafka):
    """A loop that takes a fresh transactional.id at each start leaves its crashed
    transaction open: a finding of the history (hanging-transaction)."""
    run = judged("new-transactional-id", bootstrap)
    assert "hanging-transaction" in run.findings, run.summary()
    path = run.store(tmp_path / "judge.jsonl")
    assert len(_reads(path)) == 2  # the audit's, and the aborted-input-read finding's

    with kafka_forbidden(no_kafka):
        result = CliRunner().invoke(app, ["check", str(path)])
        again = recheck(stored.load(path))
    assert result.exit_code == 0, result.output
    live = run.summary().splitlines()
    printed = result.output.strip().splitlines()
    assert printed == live[:len(printed)]  # the verdict and the findings, as printed live
    assert any("verdict:" in line for line in printed)
    assert any(line.startswith("  hanging-transaction:") for line in printed)
    assert text(again) == result.output.strip()
    assert again.report.to_dict() == run.report.to_dict()
    assert again.report.anomalies == run.report.anomalies
    assert again.findings == run.findings


def test_a_stored_table_audit_is_checked_again_without_postgresql(pg_dsn, tmp_path, no_kafka):
    """The dual write's outbox: its events are the outbox table's rows, audited where they
    are; the table's read is kept in the history and a re-check answers from it."""
    run = experiments.run("dual-write", order="outbox", announce=lambda line: None)
    assert run.crashed and (run.report.lost, run.report.duplicated) == (0, 0), run.summary()
    path = run.store(tmp_path / "outbox.jsonl")
    (at,) = _reads(path, "table-read")
    entry = json.loads(path.read_text().splitlines()[at])
    assert entry["table"] == "outbox" and len(entry["rows"]) == run.report.delivered_unique

    env = {**os.environ, "LABKIT_BOOTSTRAP": no_kafka,
           "LABKIT_PG_DSN": f"postgresql://lab@{no_kafka}/nowhere"}
    out = subprocess.run([str(LABKIT), "check", str(path)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == run.report.summary().strip()
    with kafka_forbidden(no_kafka):
        again = recheck(stored.load(path))
    assert again.report.to_dict() == run.report.to_dict()

    # one row gone from the stored read: that event is lost
    lines = path.read_text().splitlines()
    dropped = entry["rows"].pop(len(entry["rows"]) // 2)
    lines[at] = json.dumps(entry)
    path.write_text("\n".join(lines) + "\n")
    with kafka_forbidden(no_kafka):
        edited = recheck(stored.load(path))
    assert (edited.report.lost, edited.report.duplicated) == (1, 0)
    assert edited.report.examples["lost"] == [str(dropped[entry["columns"].index("id")])]
    assert edited.verdict != run.verdict


@pytest.mark.parametrize("name, options", [
    ("share-group", {"guarantee": "at_least_once", "crash_at": "after-process-before-ack",
                     "records": 10}),
    ("kafka-replay", {"guarantee": "exactly_once"}),
    ("streams-restore", {}),
])
def test_a_stored_queue_replay_or_counts_run_is_checked_again_offline(name, options, bootstrap,
                                                                      tmp_path, no_kafka):
    """The share group's queue audit, the replay's one-processing audit and Kafka Streams'
    counts audit (its fault named from the history) read the output through
    labkit.checking.reads: one read entry each, and a re-check gives the live report."""
    run = experiments.run(name, cluster=bootstrap, **options)
    path = run.store(tmp_path / "run.jsonl")
    (at,) = _reads(path)
    checked_again(run, path, no_kafka)
    if name == "share-group":  # an id processed once, gone from the stored read: lost
        once = drop_one_read(path, at)
        with kafka_forbidden(no_kafka):
            edited = recheck(stored.load(path))
        assert edited.report.lost == run.report.lost + 1
        assert once in edited.report.examples["lost"]


def own_read(run):
    """A checker that reads Kafka by code of its own: nothing of it is in the history."""
    return audit.audit_topic(run.bootstrap, run.topics["output"], run.inputs, "own-read",
                             "exactly_once")


def test_a_run_whose_checker_cannot_be_replayed_is_refused_by_name(tmp_path, no_kafka,
                                                                   monkeypatch):
    """The lab's experiments all re-check now (the test below); a new one whose checker
    reads Kafka itself is refused by name, and no verdict is printed."""
    # a copy of the registry that the experiment joins and that is undone after
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry.catalog()))
    registry.register(registry.Experiment(
        "own-read", "a checker that reads Kafka itself", checkers=lambda o: [own_read]))
    path = stored.store(tmp_path / "run.jsonl", experiment="own-read", options={},
                        topics={"output": "t"}, inputs=[], history=[])
    with kafka_forbidden(no_kafka):
        result = CliRunner().invoke(app, ["check", str(path)])
    assert result.exit_code != 0
    assert "own_read (tests.test_stored_runs)" in result.output, result.output
    assert "cannot be checked again offline yet" in result.output
    assert "verdict" not in result.output


def test_every_experiment_of_the_lab_can_be_checked_again():
    """Each experiment's checkers, built from its options as ``labkit check`` builds them,
    say they read only what the history holds (an option it requires: its first choice,
    or on)."""
    given = {"torture": {"command": ["true"]}}
    for name, experiment in registry.catalog().items():
        options = {o.name: o.choices[0] if o.choices else True for o in experiment.options
                   if o.default is registry.REQUIRED}
        built = experiment.checkers(SimpleNamespace(**experiment.resolve(
            {**options, **given.get(name, {})})))
        refused = [c for c in built if not getattr(c, "replayable", False)]
        assert not refused, (name, refused)


def test_a_run_stored_without_its_reads_is_refused(tmp_path, no_kafka):
    options = get("consume-transform-produce").resolve({"guarantee": "exactly_once"})
    path = stored.store(tmp_path / "run.jsonl", experiment="consume-transform-produce",
                        options=options, topics={"output": "t"}, inputs=[{"id": "a", "key": "k"}],
                        history=[{"t": 0.0, "kind": "started", "instance": "0"}])
    not_a_run = tmp_path / "other.jsonl"
    not_a_run.write_text('{"kind": "started"}\n')
    with kafka_forbidden(no_kafka):
        result = CliRunner().invoke(app, ["check", str(path)])
        other = CliRunner().invoke(app, ["check", str(not_a_run)])
    assert result.exit_code != 0 and "holds 0 read(s) of its output topic" in result.output
    result = other
    assert result.exit_code != 0 and "is not a stored run" in result.output


def test_a_read_entry_gives_back_what_each_reader_got():
    everything = [Rec(0, 0, "k", {"id": "a"}), Rec(1, 0, "k", {"id": "b"}),
                  Rec(0, 1, "k", {"id": "c"})]  # b: an aborted transaction's
    committed = [Rec(0, 0, "k", {"id": "a"}), Rec(0, 1, "k", {"id": "c"}),
                 Rec(0, 2, None, {"id": "d"})]  # d: committed between the two reads
    entry = json.loads(json.dumps(reads.entry_of("output", "t", everything, committed)))
    assert [r[4] for r in entry["records"]] == ["cu", "u", "cu", "c"]
    read = reads.of_entry(entry)
    assert (read.everything, read.committed) == (everything, committed)
    assert read.seen_by("read_uncommitted") == everything
    # a stamped read keeps each record's timestamp (Rec's equality leaves it out)
    stamped = [Rec(0, 0, "k", {"id": "a"}, 1000), Rec(0, 1, "k", {"id": "c"}, 1005)]
    entry = json.loads(json.dumps(reads.entry_of("input", "t", stamped, stamped, stamped=True)))
    assert [r.timestamp_ms for r in reads.of_entry(entry).committed] == [1000, 1005]
    plain = json.loads(json.dumps(reads.entry_of("input", "t", stamped, stamped)))
    assert [r.timestamp_ms for r in reads.of_entry(plain).committed] == [None, None]
