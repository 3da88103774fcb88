"""The audit: ground truth about what a pipeline did to the data.

It compares the ids that went in with what is observable afterwards (an output topic read
with read_committed, a database table, the final state) and never looks at the pipeline's
own bookkeeping. Each finding is one checker in labkit.checking.checkers, named after Jepsen's Kafka
checker so a learner can look them up (lost-write, duplicate, non-monotonic, aborted-read,
state drift), and ``checkers.verdict`` is the one rule that turns them into a guarantee.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import pandas as pd

from labkit.checking import checkers

from labkit.kafka import topics
from labkit.checking.checkers import Delivered, Result
from labkit.checking.reads import Read
from labkit.storage.db import read_table

# The exact keys `labkit scenario --json` prints, in order (new keys only ever appended).
REPORT_KEYS = (
    "scenario", "guarantee", "crash_at", "fault", "produced", "delivered_unique", "lost",
    "duplicated", "reordered", "aborted_visible", "state_expected", "state_actual",
    "aborted_in_log", "verdict", "anomalies",
)
# checker -> the report field counting it (also the key of its examples)
COUNT_FIELDS = {checkers.LOST_WRITE: "lost", checkers.DUPLICATE: "duplicated",
                checkers.ABORTED_READ: "aborted_visible", checkers.NON_MONOTONIC: "reordered"}
EXAMPLE_KEYS = {**COUNT_FIELDS, checkers.STATE_DRIFT: "state_drift"}  # keys of report.examples


@dataclass
class AuditReport:
    scenario: str
    guarantee: str
    crash_at: str | None = None
    fault: str | None = None
    produced: int = 0
    delivered_unique: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    aborted_visible: int = 0
    state_expected: dict | int | None = None
    state_actual: dict | int | None = None
    # Records of aborted transactions present in the output log, whether or not the audited
    # reader saw them (None: the output is a table, there is no log to look at).
    aborted_in_log: int | None = None
    # Inputs not in the output that a restart of the group reads again (never processed, the
    # offsets not committed past them): not lost, a loop that stopped short (the judge's
    # finding). Not part of the JSON contract.
    unprocessed: int = 0
    # Examples of each finding, for explanations (not part of the JSON contract).
    examples: dict[str, list] = field(default_factory=dict, repr=False, compare=False)
    # Findings of the run's other checkers (a zombie's write let through, a fatal error
    # carried on): judged by the same verdict, named in ``anomalies``.
    extra: list[Result] = field(default_factory=list, repr=False, compare=False)

    @property
    def state_matches(self) -> bool:
        return self.state_expected == self.state_actual

    def findings(self) -> list[Result]:
        """The checkers' results as this report's counts state them: the verdict's input.

        Built from the fields, so a report made by hand is judged by the same rule."""
        counted = [Result(name, getattr(self, f) == 0, getattr(self, f), self.examples.get(f, []))
                   for name, f in COUNT_FIELDS.items()]
        return [*counted, checkers.state_drift(self.state_expected, self.state_actual),
                *self.extra]

    @property
    def verdict(self) -> str:
        """exactly once | at least once | at most once | incorrect (see checkers.verdict)."""
        return checkers.verdict(self.findings())

    @property
    def anomalies(self) -> list[str]:
        return checkers.anomalies(self.findings())

    @property
    def exactly_once(self) -> bool:
        return self.verdict == checkers.EXACTLY_ONCE

    def to_dict(self) -> dict:
        d = {**asdict(self), "verdict": self.verdict, "anomalies": self.anomalies}
        return {k: d[k] for k in REPORT_KEYS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    def to_frame(self) -> pd.DataFrame:
        row = self.to_dict()
        for key in ("state_expected", "state_actual"):
            if isinstance(row[key], dict):
                row[key] = json.dumps(row[key], sort_keys=True)
        row["anomalies"] = ", ".join(row["anomalies"])  # one cell, as text
        return pd.DataFrame([row], columns=list(REPORT_KEYS))

    def summary(self) -> str:
        """A short, stable text for notebooks: a sentence a beginner reads, the counts, and
        the verdict. Every word is defined in docs/audit.md, "Reading the audit"."""
        state = ""
        if self.state_expected is not None:
            state = f"  state: {'matches' if self.state_matches else 'DRIFTED'}"
        return (f"{self.scenario} [{self.guarantee}] crash_at={self.crash_at} fault={self.fault}\n"
                f"  {self.sentence()}\n"
                f"  produced={self.produced} delivered_unique={self.delivered_unique} "
                f"lost={self.lost} duplicated={self.duplicated} reordered={self.reordered} "
                f"aborted_visible={self.aborted_visible}{state}\n  verdict: {self.verdict_text()}")

    def sentence(self) -> str:
        """What happened to the records in this run, in words: '40 in, 30 out: 10 lost, ...'."""
        waiting = (f" {self.unprocessed} not processed (a restart of the group reads them "
                   "again: not lost)." if self.unprocessed else "")
        if not self.anomalies:
            return (f"{self.produced} in, {self.delivered_unique} out, each once: "
                    f"nothing lost, nothing duplicated in this run.{waiting}")
        found = [f"{self.lost} lost" if self.lost else "nothing lost",
                 f"{self.duplicated} duplicated" if self.duplicated else "nothing duplicated"]
        if self.reordered:
            found.append(f"{self.reordered} out of order")
        if self.aborted_visible:
            found.append(f"{self.aborted_visible} from aborted transactions seen")
        if self.state_expected is not None and not self.state_matches:
            found.append("the state is off")
        return f"{self.produced} in, {self.delivered_unique} out: {', '.join(found)}.{waiting}"

    def verdict_text(self) -> str:
        """The verdict as the summary words it: a run shows what happened once, so only an
        exactly_once run that survived a recorded crash or fault reads 'exactly once'."""
        if self.anomalies:
            shape = (f"it behaved as {self.verdict}" if self.verdict != checkers.INCORRECT
                     else "neither at most once nor at least once")
            return f"NOT exactly once ({', '.join(self.anomalies)}): {shape}"
        injected = [f"crash at {self.crash_at}"] if self.crash_at else []
        injected += [f"fault {self.fault}"] if self.fault else []
        if self.guarantee == "exactly_once" and injected:
            return f"exactly once in this run, under the {' and the '.join(injected)}"
        reason = (f"{self.guarantee} does not promise exactly once" if injected
                  else "no crash point or network fault in this run")
        return f"no anomaly seen in this run (not a guarantee: {reason})"


# --------------------------------------------------------------------------- the checker

def expected_counts(inputs: list[dict]) -> dict[str, int]:
    """The state a running count per key must end with: each input record counted once."""
    counts: dict[str, int] = {}
    for r in inputs:
        counts[str(r["key"])] = counts.get(str(r["key"]), 0) + 1
    return dict(sorted(counts.items()))


def report_of(scenario: str, guarantee: str, results: list[Result], *, produced: int,
              delivered_unique: int, crash_at: str | None = None, fault: str | None = None,
              state_expected: dict | int | None = None, state_actual: dict | int | None = None,
              aborted_in_log: int | None = None,
              unexpected: list | None = None) -> AuditReport:
    """An AuditReport whose counts and examples are the checkers' ``results``."""
    counts = {COUNT_FIELDS[r.name]: r.count for r in results if r.name in COUNT_FIELDS}
    examples = {EXAMPLE_KEYS[r.name]: r.examples for r in results}
    examples["unexpected"] = (unexpected or [])[:checkers.EXAMPLES]
    report = AuditReport(scenario=scenario, guarantee=guarantee, crash_at=crash_at, fault=fault,
                         produced=produced, delivered_unique=delivered_unique,
                         state_expected=state_expected, state_actual=state_actual,
                         aborted_in_log=aborted_in_log, **counts)
    report.examples = {k: v for k, v in examples.items() if v}
    return report


def check(scenario: str, guarantee: str, inputs: list[dict], delivered: list[Delivered], *,
          crash_at: str | None = None, fault: str | None = None, aborted: list[Delivered] = (),
          state_expected: dict | int | None = None, state_actual: dict | int | None = None,
          aborted_in_log: int | None = None,
          not_owed: frozenset[str] = frozenset()) -> AuditReport:
    """Run every checker on ``inputs`` (in input order) and what was ``delivered`` (in the
    order the sink shows it); ``aborted`` are the delivered records of aborted transactions.
    ``not_owed``: ids a restart would read again (the group has not committed past them);
    missing, they are ``unprocessed``, not lost.

    Delivered ids that never went in are kept as ``examples["unexpected"]``.
    """
    ids = [r["id"] for r in inputs]
    if len(set(ids)) != len(ids):
        raise ValueError("input ids must be unique: the audit counts by id")
    seen = [d.id for d in delivered]
    delivered_ids = set(seen)
    unprocessed = [i for i in ids if i in not_owed and i not in delivered_ids]
    owed = [i for i in ids if i not in not_owed or i in delivered_ids] if unprocessed else ids
    results = [checkers.lost_write(owed, seen), checkers.duplicate(ids, seen),
               checkers.aborted_read([a.id for a in aborted]),
               checkers.non_monotonic(ids, delivered),
               checkers.state_drift(state_expected, state_actual)]
    wanted = set(ids)
    report = report_of(scenario, guarantee, results, produced=len(ids),
                       delivered_unique=len(wanted.intersection(seen)), crash_at=crash_at,
                       fault=fault, state_expected=state_expected, state_actual=state_actual,
                       aborted_in_log=aborted_in_log,
                       unexpected=list(dict.fromkeys(i for i in seen if i not in wanted)))
    if unprocessed:
        report.unprocessed = len(unprocessed)
        report.examples["unprocessed"] = unprocessed[:checkers.EXAMPLES]
    return report


def check_counts(scenario: str, guarantee: str, produced: int, state_expected: dict[str, int],
                 state_actual: dict[str, int], *, crash_at: str | None = None,
                 fault: str | None = None) -> AuditReport:
    """For a sink that keeps only totals per key (the records are gone): a shortfall per key
    counts as lost writes, an excess as duplicates."""
    lost = checkers.count_shortfall(state_expected, state_actual)
    results = [lost, checkers.count_excess(state_expected, state_actual),
               checkers.state_drift(state_expected, state_actual)]
    return report_of(scenario, guarantee, results, produced=produced,
                     delivered_unique=produced - lost.count, crash_at=crash_at, fault=fault,
                     state_expected=state_expected, state_actual=state_actual)


def delivered_of(records: list[topics.Rec], id_field: str = "id",
                 key_field: str = "key") -> list[Delivered]:
    """Records read back from a topic, in log order, as the checker's observations."""
    return [Delivered(str(r.value[id_field]), r.value.get(key_field, r.key), r.offset,
                      r.partition) for r in records]


def last_value_per_key(records: list[topics.Rec], field_name: str = "count") -> dict[str, int]:
    """Final state as a topic shows it: the last ``field_name`` seen for each key."""
    state: dict[str, int] = {}
    for r in records:
        state[str(r.value.get("key", r.key))] = r.value[field_name]
    return dict(sorted(state.items()))


def audit_topic(bootstrap: str, topic: str, inputs: list[dict], scenario: str, guarantee: str, *,
                crash_at: str | None = None, fault: str | None = None,
                isolation: str = "read_committed", state_field: str | None = None) -> AuditReport:
    """Audit an output topic as a downstream consumer reading with ``isolation`` sees it,
    read now from Kafka (an experiment's checker reads it through ``labkit.checking.reads``,
    which keeps the read in the run's history: ``checks.TopicAudit``)."""
    read = Read(topics.read(bootstrap, topic, isolation="read_uncommitted"),
                topics.read(bootstrap, topic, isolation="read_committed"))
    return audit_read(read, inputs, scenario, guarantee, crash_at=crash_at, fault=fault,
                      isolation=isolation, state_field=state_field)


def audit_read(read: Read, inputs: list[dict], scenario: str, guarantee: str, *,
               crash_at: str | None = None, fault: str | None = None,
               isolation: str = "read_committed", state_field: str | None = None,
               not_owed: frozenset[str] = frozenset()) -> AuditReport:
    """Audit a topic as both readers got it (``read``), for a consumer reading with
    ``isolation``.

    Records a read_uncommitted reader gets and a read_committed one does not belong to
    aborted transactions (``aborted_in_log``); those the audited reader saw are aborted
    reads (``aborted_visible``). With ``state_field`` (e.g. "count"), the last value per
    key is compared to the count of input records per key (state drift).
    """
    everything, committed = read.everything, read.committed
    records = read.seen_by(isolation)
    committed_at = {(r.partition, r.offset) for r in committed}
    aborted_in_log = sum(1 for r in everything if (r.partition, r.offset) not in committed_at)
    seen = delivered_of(records)
    aborted = [d for d in seen if (d.partition, d.offset) not in committed_at]
    state_expected = state_actual = None
    if state_field:
        state_expected = expected_counts(inputs)
        state_actual = last_value_per_key(records, state_field)
    return check(scenario, guarantee, inputs, seen, crash_at=crash_at, fault=fault,
                 aborted=aborted, state_expected=state_expected, state_actual=state_actual,
                 aborted_in_log=aborted_in_log, not_owed=not_owed)


# a table's columns as the audit reads them: (table, columns, order_by) -> column -> values
# (the database's, or a run's read of it kept in its history: labkit.checking.reads.table)
TableReader = Callable[[str, Sequence[str], "str | None"], Mapping[str, Sequence]]


def _reader(db: str | TableReader) -> TableReader:
    """``db`` as a TableReader: a SQLite file or PostgreSQL DSN is read with the lab's one
    table reader (labkit.storage.db.read_table)."""
    if callable(db):
        return db
    return lambda table, columns, order_by: read_table(db, table, columns, order_by=order_by)


def delivered_of_table(db: str | TableReader, table: str, id_column: str = "id",
                       key_column: str = "key", order_by: str | None = None) -> list[Delivered]:
    """Rows of a table (SQLite file or PostgreSQL DSN, or a TableReader) in insertion order
    (or ``order_by``'s, for a table that keeps none), as the checker's observations."""
    rows = _reader(db)(table, (id_column, key_column), order_by)
    return [Delivered(str(i), k) for i, k in zip(rows[id_column], rows[key_column])]


def counts_in_table(db: str | TableReader, table: str, key_column: str,
                    count_column: str) -> dict[str, int]:
    """A table of running counts (one row per key) as the state the audit compares."""
    rows = _reader(db)(table, (key_column, count_column), key_column)
    return dict(sorted(zip(map(str, rows[key_column]), map(int, rows[count_column]))))


def audit_table(db: str | TableReader, table: str, inputs: list[dict], scenario: str,
                guarantee: str, *, crash_at: str | None = None, fault: str | None = None,
                counts: tuple[str, str, str] | None = None,
                key_column: str = "key", order_by: str | None = None) -> AuditReport:
    """Audit a database sink table (a SQLite file or a PostgreSQL DSN, or a TableReader):
    what rows ended up there, lost and duplicated ids, in the order the rows were inserted.
    ``counts``: a table of running counts too, ``(table, key column, count column)``, against
    the input's count per key (state drift). ``key_column``: the rows' key (what per-key
    order is about); ``order_by``: the order to judge them in, for a table that keeps no
    insertion order."""
    state_expected = state_actual = None
    if counts is not None:
        state_expected, state_actual = expected_counts(inputs), counts_in_table(db, *counts)
    return check(scenario, guarantee, inputs,
                 delivered_of_table(db, table, key_column=key_column, order_by=order_by),
                 crash_at=crash_at,
                 fault=fault, state_expected=state_expected, state_actual=state_actual)


def mixed_report(scenario: str, guarantee: str, crash_at: str | None, produced: int,
                 delivered_ids: list[str], mixed: Result) -> AuditReport:
    """The audit of a replay whose lookup changed while it was down: an id delivered twice
    is duplicated, and a key whose output matches no single processing of its records
    (``checkers.single_processing``) is a drifted key of the computed state, which the one
    verdict calls incorrect unless duplicates explain it. (A record the lookup screens out
    has no output, so a missing id is not a loss here.)"""
    return AuditReport(scenario, guarantee, crash_at, produced=produced,
                       delivered_unique=len(set(delivered_ids)),
                       duplicated=len(delivered_ids) - len(set(delivered_ids)),
                       state_expected={},
                       state_actual={key: "mixed" for key in mixed.examples},
                       examples={"state_drift": list(mixed.examples)})
