"""The audit: ground truth about what a pipeline did to the data.

It compares the ids that went in with what is observable afterwards (an output topic read
with read_committed, a database table, the final state) and never looks at the pipeline's
own bookkeeping. Findings are named after Jepsen's Kafka checker so a learner can look
them up: lost write, duplicate, non-monotonic (reordered), aborted read, state drift.
"""
from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import asdict, dataclass, field

import pandas as pd

from labkit import topics

# The exact keys `labkit scenario --json` prints, in order.
REPORT_KEYS = (
    "scenario", "guarantee", "crash_at", "fault", "produced", "delivered_unique", "lost",
    "duplicated", "reordered", "aborted_visible", "state_expected", "state_actual",
)


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
    # Examples of each finding, for explanations (not part of the JSON contract).
    examples: dict[str, list] = field(default_factory=dict, repr=False, compare=False)

    @property
    def state_matches(self) -> bool:
        return self.state_expected == self.state_actual

    @property
    def exactly_once(self) -> bool:
        return (self.lost == 0 and self.duplicated == 0 and self.aborted_visible == 0
                and self.state_matches)

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: d[k] for k in REPORT_KEYS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    def to_frame(self) -> pd.DataFrame:
        row = self.to_dict()
        for key in ("state_expected", "state_actual"):
            if isinstance(row[key], dict):
                row[key] = json.dumps(row[key], sort_keys=True)
        return pd.DataFrame([row], columns=list(REPORT_KEYS))

    def summary(self) -> str:
        """A short, stable text for notebooks (nbval compares it)."""
        verdict = "exactly once" if self.exactly_once else "NOT exactly once"
        state = ""
        if self.state_expected is not None:
            state = f"  state: {'matches' if self.state_matches else 'DRIFTED'}"
        return (f"{self.scenario} [{self.guarantee}] crash_at={self.crash_at} fault={self.fault}\n"
                f"  produced={self.produced} delivered_unique={self.delivered_unique} "
                f"lost={self.lost} duplicated={self.duplicated} reordered={self.reordered} "
                f"aborted_visible={self.aborted_visible}{state}\n  verdict: {verdict}")


# --------------------------------------------------------------------------- the checker

EXAMPLES_PER_FINDING = 5


@dataclass(frozen=True)
class Delivered:
    """One record as observed downstream, in the order it was observed."""

    id: str
    key: str | None
    offset: int | None = None  # topic offset (None for a table row)


def expected_counts(inputs: list[dict]) -> dict[str, int]:
    """The state a running count per key must end with: each input record counted once."""
    counts: dict[str, int] = {}
    for r in inputs:
        counts[str(r["key"])] = counts.get(str(r["key"]), 0) + 1
    return dict(sorted(counts.items()))


def check(scenario: str, guarantee: str, inputs: list[dict], delivered: list[Delivered], *,
          crash_at: str | None = None, fault: str | None = None, aborted: list[Delivered] = (),
          state_expected: dict | int | None = None,
          state_actual: dict | int | None = None) -> AuditReport:
    """Classify what happened to ``inputs`` (in input order) given what was ``delivered``.

    - lost write: an input id never delivered
    - duplicate: every extra copy of a delivered id
    - reordered (non-monotonic): a record delivered, for the first time, after a record of
      the same key that came later in the input
    - aborted read: a delivered record that belongs to an aborted transaction (``aborted``)
    - state drift: ``state_expected != state_actual`` (the differing keys are examples)
    """
    position = {r["id"]: i for i, r in enumerate(inputs)}
    if len(position) != len(inputs):
        raise ValueError("input ids must be unique: the audit counts by id")
    seen: dict[str, int] = {}
    reordered: list[str] = []
    latest_per_key: dict[str | None, int] = {}
    for d in delivered:
        seen[d.id] = seen.get(d.id, 0) + 1
        if seen[d.id] > 1 or d.id not in position:
            continue
        pos = position[d.id]
        if pos < latest_per_key.get(d.key, -1):
            reordered.append(d.id)
        latest_per_key[d.key] = max(pos, latest_per_key.get(d.key, -1))
    lost = [i for i in position if i not in seen]
    dups = sorted((i for i, n in seen.items() if n > 1), key=lambda i: position.get(i, -1))
    report = AuditReport(
        scenario=scenario, guarantee=guarantee, crash_at=crash_at, fault=fault,
        produced=len(inputs), delivered_unique=sum(1 for i in seen if i in position),
        lost=len(lost), duplicated=sum(n - 1 for n in seen.values() if n > 1),
        reordered=len(reordered), aborted_visible=len(aborted),
        state_expected=state_expected, state_actual=state_actual,
    )
    examples = {
        "lost": lost[:EXAMPLES_PER_FINDING],
        "duplicated": dups[:EXAMPLES_PER_FINDING],
        "reordered": reordered[:EXAMPLES_PER_FINDING],
        "aborted_visible": [a.id for a in aborted][:EXAMPLES_PER_FINDING],
        "unexpected": [i for i in seen if i not in position][:EXAMPLES_PER_FINDING],
        "state_drift": _drifted_keys(state_expected, state_actual)[:EXAMPLES_PER_FINDING],
    }
    report.examples = {k: v for k, v in examples.items() if v}
    return report


def _drifted_keys(expected, actual) -> list:
    if not isinstance(expected, dict) or not isinstance(actual, dict):
        return [] if expected == actual else ["(total)"]
    return sorted(k for k in set(expected) | set(actual) if expected.get(k) != actual.get(k))


def delivered_of(records: list[topics.Rec], id_field: str = "id",
                 key_field: str = "key") -> list[Delivered]:
    """Records read back from a topic, in log order, as the checker's observations."""
    return [Delivered(str(r.value[id_field]), r.value.get(key_field, r.key), r.offset)
            for r in records]


def last_value_per_key(records: list[topics.Rec], field_name: str = "count") -> dict[str, int]:
    """Final state as a topic shows it: the last ``field_name`` seen for each key."""
    state: dict[str, int] = {}
    for r in records:
        state[str(r.value.get("key", r.key))] = r.value[field_name]
    return dict(sorted(state.items()))


def audit_topic(bootstrap: str, topic: str, inputs: list[dict], scenario: str, guarantee: str, *,
                crash_at: str | None = None, fault: str | None = None,
                isolation: str = "read_committed", state_field: str | None = None) -> AuditReport:
    """Audit an output topic as a downstream consumer reading with ``isolation`` sees it.

    Records that consumer sees but a read_committed reader does not are aborted reads.
    With ``state_field`` (e.g. "count"), the last value per key is compared to the count of
    input records per key (state drift).
    """
    records = topics.read(bootstrap, topic, isolation=isolation)
    seen = delivered_of(records)
    aborted: list[Delivered] = []
    if isolation != "read_committed":
        committed = {r.offset for r in topics.read(bootstrap, topic, "read_committed")}
        aborted = [d for d in seen if d.offset not in committed]
    state_expected = state_actual = None
    if state_field:
        state_expected = expected_counts(inputs)
        state_actual = last_value_per_key(records, state_field)
    return check(scenario, guarantee, inputs, seen, crash_at=crash_at, fault=fault,
                 aborted=aborted, state_expected=state_expected, state_actual=state_actual)


def read_table(db_path: str, table: str, id_column: str = "id",
               key_column: str = "key") -> list[Delivered]:
    """Rows of a SQLite table in insertion order (rowid)."""
    if not table.isidentifier():
        raise ValueError(f"not a table name: {table!r}")
    with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        rows = db.execute(f"SELECT {id_column}, {key_column} FROM {table} ORDER BY rowid").fetchall()
    return [Delivered(str(i), k) for i, k in rows]


def audit_table(db_path: str, table: str, inputs: list[dict], scenario: str, guarantee: str, *,
                crash_at: str | None = None, fault: str | None = None) -> AuditReport:
    """Audit a database sink table (SQLite): what rows ended up there."""
    return check(scenario, guarantee, inputs, read_table(db_path, table), crash_at=crash_at,
                 fault=fault)
