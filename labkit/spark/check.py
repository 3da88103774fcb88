"""The Spark lessons' audit: what the sinks left behind, compared with what went in.

It reads only what is observable afterwards (the sink's table, the output topic) and the
ids that went in, never the query's checkpoint or the sink's offsets table.
(Spark-specific for now; the id/count arithmetic belongs with labkit.audit once it has
shared audit functions.)
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import pandas as pd

from labkit import topics
from labkit.audit import AuditReport
from labkit.spark.db import Database
from labkit.spark.sinks import RECORD_COLUMNS


def table_records(db_url: str, table: str) -> pd.DataFrame:
    """Every row a record sink wrote, duplicates included, in write order."""
    with Database(db_url) as db:
        rows = db.query(f"SELECT {', '.join(RECORD_COLUMNS)} FROM {table} ORDER BY batch_id, kafka_partition, kafka_offset")
    return pd.DataFrame(rows, columns=list(RECORD_COLUMNS))


def table_counts(db_url: str, table: str) -> dict[str, int]:
    """The count sinks' table: key -> total."""
    with Database(db_url) as db:
        return {k: int(n) for k, n in sorted(db.query(f"SELECT key, total FROM {table}"))}


def topic_records(bootstrap: str, topic: str) -> pd.DataFrame:
    """The output topic read back with read_committed: partition, offset, key (= id), value."""
    recs = topics.read(bootstrap, topic)
    return pd.DataFrame([(r.partition, r.offset, r.key, r.value.get("key")) for r in recs],
                        columns=["partition", "offset", "id", "key"])


def dedupe_by_id(records: pd.DataFrame) -> pd.DataFrame:
    """The downstream fix for an at-least-once sink: keep the first copy of each id."""
    return records.drop_duplicates(subset="id", keep="first", ignore_index=True)


def count_keys(keys: Iterable[str]) -> dict[str, int]:
    return dict(sorted(Counter(keys).items()))


def audit_ids(scenario: str, guarantee: str, crash_at: str | None, produced: Sequence[str],
              delivered: Sequence[str], state_expected: dict[str, int],
              state_actual: dict[str, int]) -> AuditReport:
    """Lost = produced ids never delivered; duplicated = extra copies of delivered ids."""
    seen = Counter(delivered)
    lost = [i for i in produced if i not in seen]
    dups = sorted(i for i, n in seen.items() if n > 1)
    return AuditReport(
        scenario=scenario, guarantee=guarantee, crash_at=crash_at, produced=len(produced),
        delivered_unique=len(seen), lost=len(lost), duplicated=sum(seen[i] - 1 for i in dups),
        state_expected=state_expected, state_actual=state_actual,
        examples={"lost": lost[:5], "duplicated": dups[:5]})


def audit_counts(scenario: str, guarantee: str, crash_at: str | None, produced: int,
                 state_expected: dict[str, int], state_actual: dict[str, int]) -> AuditReport:
    """For a count sink the records are gone, only totals remain: a shortfall per key counts
    as lost, an excess as duplicated."""
    keys = sorted(set(state_expected) | set(state_actual))
    diff = {k: state_actual.get(k, 0) - state_expected.get(k, 0) for k in keys}
    lost = sum(-d for d in diff.values() if d < 0)
    return AuditReport(
        scenario=scenario, guarantee=guarantee, crash_at=crash_at, produced=produced,
        delivered_unique=produced - lost, lost=lost,
        duplicated=sum(d for d in diff.values() if d > 0),
        state_expected=state_expected, state_actual=state_actual,
        examples={"drift": [f"{k}: {d:+d}" for k, d in diff.items() if d][:5]})
