"""Checkers and the judge's findings are functions of the run's history (issue 50): none
reads another part's live object (the clients, the nemesis, the workers, a fault), so a
stored history can be judged again. Static, and one history judged as it was written."""
import ast
import json
import types
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
    # checkers return what they counted (checks.Counted) and observe nothing; the judge's
    # findings read nothing but the history, not even the facts
    found = [read for path in sorted((ROOT / "labkit/checking").glob("*.py"))
             for read in _live_reads(path, LIVE | {"observe"})]
    found += _live_reads(ROOT / "labkit/experiments/judge_findings.py", LIVE | {"facts"})
    assert not found, found


def _names(code: types.CodeType) -> set[str]:
    """The attribute and global names a function's code uses, its nested functions' too."""
    return set(code.co_names).union(*(_names(c) for c in code.co_consts
                                      if isinstance(c, types.CodeType)))


def _code_of(checker: object) -> list[types.CodeType]:
    """A checker's code: the function, or its class's ``__call__`` and the functions it holds
    (e.g. a ``Finding``'s check, an audit's ``read_from``)."""
    if hasattr(checker, "__code__"):
        return [checker.__code__]
    held = [v.__code__ for v in vars(checker).values() if hasattr(v, "__code__")] \
        if hasattr(checker, "__dict__") else []
    return [type(checker).__call__.__code__, *held]


def test_no_registered_experiments_checker_reads_a_live_part():
    """Every checker the registry builds (as ``labkit check`` builds them), wherever it is
    written, names none of the live parts: what the clients were told reaches it through
    the history (e.g. the acknowledging producer's ``acked_by``)."""
    from types import SimpleNamespace

    from labkit.experiments import registry

    given = {"torture": {"command": ["true"]}}
    found = []
    for name, experiment in registry.catalog().items():
        options = {o.name: o.choices[0] if o.choices else True for o in experiment.options
                   if o.default is registry.REQUIRED}
        for checker in experiment.checkers(SimpleNamespace(**experiment.resolve(
                {**options, **given.get(name, {})}))):
            found += [(name, checker, sorted(_names(code) & LIVE))
                      for code in _code_of(checker) if _names(code) & LIVE]
    assert not found, found


WRITES = {"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "__setitem__"}


def _facts_writes(path: Path) -> list[str]:
    """``x.facts[k] = v``, ``x.facts = ...``, ``x.facts.update(...)`` and the like,
    ``x.facts[k].append(...)``: any write into a run's facts but ``observe``."""
    def is_facts(node: ast.AST) -> bool:
        while isinstance(node, ast.Subscript):
            node = node.value
        return isinstance(node, ast.Attribute) and node.attr == "facts"

    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for n in ast.walk(tree):
        targets = (n.targets if isinstance(n, ast.Assign) else [n.target]
                   if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else [])
        if any(is_facts(t) for t in targets if isinstance(t, (ast.Attribute, ast.Subscript))):
            found.append(f"{path.relative_to(ROOT)}:{n.lineno}")
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in WRITES and is_facts(n.func.value)):
            found.append(f"{path.relative_to(ROOT)}:{n.lineno} .{n.func.attr}")
    return found


def test_a_runs_facts_are_written_only_through_the_history():
    """Every part says what it saw with ``run.observe`` (an ``observed`` entry of the
    history); the facts are those entries merged, read-only, and nothing else writes them."""
    found = [w for path in sorted((ROOT / "labkit").rglob("*.py")) for w in _facts_writes(path)]
    assert not found, found


def test_observed_facts_are_history_entries_read_only_and_start_over_with_the_run(tmp_path,
                                                                                  monkeypatch):
    from labkit.checking import history
    from labkit.experiments.context import RunContext

    monkeypatch.setenv("LABKIT_HOME", str(tmp_path))
    run = RunContext("example", {})
    run.observe(producers=1, errors=[])
    run.observe(producers=2, job=object())  # a live object: this run's, named in the entry
    assert run.facts["producers"] == 2 and run.facts["errors"] == []
    try:
        run.facts["producers"] = 3  # type: ignore[index]
        raise AssertionError("a run's facts took a write that is not an observation")
    except TypeError:
        pass
    written = [e for e in history.read(run.history_file) if e["kind"] == history.OBSERVED]
    assert [e["facts"] for e in written] == [{"producers": 1, "errors": []}, {"producers": 2}]
    assert written[1]["not_stored"] == {"job": "object"}
    assert history.facts_of(written) == {"producers": 2, "errors": []}
    run.again()  # made again: its facts start over, in the history too
    run.observe(attempts=2)
    assert dict(run.facts) == {"attempts": 2}
    assert history.facts_of(history.read(run.history_file)) == {"attempts": 2}
    run.close()


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
