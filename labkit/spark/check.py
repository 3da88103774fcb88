"""The Spark lessons' audit: what the sinks left behind, compared with what went in.

It reads only what is observable afterwards (the sink's table, the output topic) and the
records that went in, never the query's checkpoint or the sink's offsets table. Record
sinks are judged by labkit.checking.audit.check (lost, duplicated, reordered per key, in the order
the database numbered the rows); count sinks, which keep no record ids, by their totals per
key (labkit.checking.audit.check_counts). Both end in the lab's one verdict (labkit.checking.checkers).
"""
from __future__ import annotations

import pandas as pd

from labkit.checking import audit

from labkit.kafka import topics
from labkit.checking.audit import AuditReport, Delivered
from labkit.spark.columns import RECORD_COLUMNS, SEQUENCE_COLUMN
from labkit.storage.db import read_table


def table_records(db_url: str, table: str) -> pd.DataFrame:
    """Every row a record sink wrote, duplicates included, in the order the database numbered
    them (its own sequence column: batch ids restart when a query resumes elsewhere)."""
    return read_table(db_url, table, RECORD_COLUMNS, order_by=SEQUENCE_COLUMN)


def table_counts(db_url: str, table: str) -> dict[str, int]:
    """The count sinks' table: key -> total."""
    counts = read_table(db_url, table, ("key", "total"), order_by="key")
    return {k: int(n) for k, n in sorted(zip(counts["key"], counts["total"]))}


def topic_records(bootstrap: str, topic: str) -> pd.DataFrame:
    """The output topic read back with read_committed: partition, offset, key (= id), value."""
    recs = topics.read(bootstrap, topic)
    return pd.DataFrame([(r.partition, r.offset, r.key, r.value.get("key")) for r in recs],
                        columns=["partition", "offset", "id", "key"])


def dedupe_by_id(records: pd.DataFrame) -> pd.DataFrame:
    """The downstream fix for an at-least-once sink: keep the first copy of each id."""
    return records.drop_duplicates(subset="id", keep="first", ignore_index=True)


def delivered(records: pd.DataFrame) -> list[Delivered]:
    """Rows or topic records as the lab-wide checker's observations, in observed order."""
    return [Delivered(str(i), k) for i, k in zip(records["id"], records["key"])]


def aborted_rows(bootstrap: str, input_topic: str, rows: pd.DataFrame) -> list[Delivered]:
    """The sink's rows that came from aborted transactions of the input: their input
    position (kafka_partition, kafka_offset) is one a read_committed reader never gets."""
    committed = {(r.partition, r.offset) for r in topics.read(bootstrap, input_topic)}
    hit = rows[[(int(p), int(o)) not in committed
                for p, o in zip(rows["kafka_partition"], rows["kafka_offset"])]]
    return delivered(hit)


def audit_output(scenario: str, guarantee: str, crash_at: str | None, inputs: list[dict],
                 output: pd.DataFrame, state_expected: dict[str, int],
                 aborted: list[Delivered] | None = None) -> AuditReport:
    """labkit.checking.audit.check on a record sink's output; the state is the output's count per key.
    ``aborted``: the output's records of aborted input transactions (``aborted_rows``)."""
    return audit.check(scenario, guarantee, inputs, delivered(output), crash_at=crash_at,
                       aborted=aborted or [], state_expected=state_expected,
                       state_actual=audit.expected_counts(output.to_dict("records")))


def audit_counts(scenario: str, guarantee: str, crash_at: str | None, produced: int,
                 state_expected: dict[str, int], state_actual: dict[str, int]) -> AuditReport:
    """For a count sink the records are gone, only totals remain: a shortfall per key counts
    as lost, an excess as duplicated (labkit.checking.audit.check_counts)."""
    return audit.check_counts(scenario, guarantee, produced, state_expected, state_actual,
                              crash_at=crash_at)
