"""Checkers and the judge's findings are functions of the run's history (issue 50): none
reads another part's live object (the clients, the nemesis, the workers, a fault), so a
stored history can be judged again. Static, and one history judged as it was written."""
import ast
import json
from pathlib import Path

from labkit.experiments import judge_findings as findings

ROOT = Path(__file__).parents[1]
LIVE = {"clients", "nemesis", "workers", "fired_faults", "pool", "watch"}


def _live_reads(path: Path, live: set[str] = LIVE) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    reads = [f"{path.name}:{n.lineno} .{n.attr}" for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and n.attr in live]
    imports = [f"{path.name}:{n.lineno} imports {n.module}" for n in ast.walk(tree)
               if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("labkit.faults")]
    return reads + imports


def test_no_checker_or_finding_reads_a_live_part():
    # the checkers still write what they counted into the record's facts (not yet from the
    # history); the judge's findings read nothing but the history, not even the facts
    found = [read for path in sorted((ROOT / "labkit/checking").glob("*.py"))
             for read in _live_reads(path)]
    found += _live_reads(ROOT / "labkit/experiments/judge_findings.py", LIVE | {"facts"})
    assert not found, found


def _history(*entries: dict) -> list[dict]:
    return [json.loads(json.dumps({"t": float(i), **e})) for i, e in enumerate(entries)]


def test_a_stored_history_is_judged_as_it_was_written():
    """A successor fenced instance 0 (the proxy saw instance 0's producer told so), yet 0
    was still running at the end; a transaction was left open; the group's offsets stop
    short of records a restart reads again."""
    events = _history(
        {"kind": "started", "instance": "0", "attempt": 1, "transactional_id": "txn-0"},
        {"kind": "started", "instance": "1", "attempt": 1, "transactional_id": "txn-1"},
        {"kind": "fault", "fault": "Replace", "what": "...", "fenced": 0, "successor": 2},
        {"kind": "started", "instance": "2", "attempt": 1, "transactional_id": "txn-0"},
        {"kind": "wire", "api": "EndTxn", "transactional_id": "txn-0",
         "error": "PRODUCER_FENCED"},
        {"kind": "progress", "committed": 290, "end": 300, "output": 290,
         "unread": {"3": 10}},
        {"kind": "finished", "running": [0, 1, 2]},
        {"kind": "open-transactions", "hanging": ["txn-1"], "stranded": []})
    got = {r.name: r.examples for r in findings.behaviour(events)}
    assert got == {
        "hanging-transaction": ["txn-1"],
        "fenced-ran-on": ["instance 0 was told it was fenced and went on running"],
        "offsets-behind": ["a restart from the committed offsets reads 10 record(s) again "
                           "(partition(s) 3)"]}
    # the same run, its fenced instance gone by the end and its offsets all committed
    quiet = [e for e in events if e["kind"] not in ("finished", "open-transactions")]
    quiet[5] = {**quiet[5], "committed": 300, "unread": {}}
    assert findings.behaviour(quiet) == []


def test_what_a_restart_reads_again_is_repeated_work_or_unprocessed_never_lost():
    """Where the feed wrote each input, the group's offsets and the output as the checker read
    them once the run was over: of what a restart reads again, a record in the output is
    processed work its offsets left behind; one not in it was never processed (a stalled
    loop, audited as it stood), which the judge names and never calls lost."""
    from labkit.checking import audit
    from labkit.checking.reads import Read
    from labkit.kafka.topics import Rec

    def out(*ids: str) -> dict:  # the output as both readers got it
        return {"kind": "read", "role": "output", "topic": "t-out",
                "records": [[0, n, "k", {"id": i}, "cu"] for n, i in enumerate(ids)]}

    written = {"kind": "written", "role": "input",
               "at": {"a": [0, 0], "b": [0, 1], "c": [1, 0], "d": [1, 2]}}  # (1, 1): a marker
    offsets = {"kind": "offsets-read", "role": "input", "offsets": {"0": 1, "1": 0}}
    events = _history(written, offsets, out("a", "b", "c"))
    assert findings.restart_split(events) == (["b", "c"], ["d"])
    got = {r.name: r.examples for r in findings.behaviour(events)}
    assert got == {"offsets-behind": ["a restart from the committed offsets reads 2 processed "
                                      "record(s) again, e.g. b, c"],
                   "stopped-short": ["1 input record(s) never processed, e.g. d: a restart "
                                     "of the group reads them (not lost)"]}
    # all committed: nothing behind, nothing short, even with "d" missing (then it is lost)
    done = _history(written, {**offsets, "offsets": {"0": 2, "1": 3}}, out("a", "b", "c"))
    assert findings.behaviour(done) == []

    inputs = [{"id": i, "key": "k"} for i in "abcd"]
    read = Read(*[[Rec(0, n, "k", {"id": i}) for n, i in enumerate("abc")]] * 2)
    waiting = audit.audit_read(read, inputs, "judge", "exactly_once", not_owed=frozenset("bcd"))
    assert (waiting.lost, waiting.unprocessed, waiting.verdict) == (0, 1, "exactly once")
    assert "1 not processed (a restart of the group reads them again: not lost)" in \
        waiting.sentence()
    lost = audit.audit_read(read, inputs, "judge", "exactly_once", not_owed=frozenset("bc"))
    assert (lost.lost, lost.unprocessed, lost.examples["lost"]) == (1, 0, ["d"])
