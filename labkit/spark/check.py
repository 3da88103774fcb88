"""The Spark lessons' audit: what the sinks left behind, compared with what went in.

It reads only what is observable afterwards (the sink's table, the output topic) and the
records that went in, never the query's checkpoint or the sink's offsets table. Record
sinks are judged by labkit.checking.audit.check (lost, duplicated, reordered per key, in the order
the database numbered the rows); count sinks, which keep no record ids, by their totals per
key (labkit.checking.audit.check_counts). Both end in the lab's one verdict (labkit.checking.checkers).
``SinkAudit`` is the Spark scenarios' checker: the sink its query wrote, audited so.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd

from labkit.checking import audit, reads
from labkit.checking.audit import AuditReport, Delivered
from labkit.checking.checks import Counted
from labkit.kafka import topics
from labkit.spark import tables
from labkit.spark.columns import RECORD_COLUMNS, SEQUENCE_COLUMN
from labkit.spark.runner import recount
from labkit.spark.sinks import DELTA_KINDS
from labkit.storage.db import read_table

COUNT_KINDS = ("running-count", "increment-count")  # sinks that keep totals, not records


def table_records(db_url: str, table: str) -> pd.DataFrame:
    """Every row a record sink wrote, duplicates included, in the order the database numbered
    them (its own sequence column: batch ids restart when a query resumes elsewhere)."""
    return read_table(db_url, table, RECORD_COLUMNS, order_by=SEQUENCE_COLUMN)


def counts_of(rows: Mapping[str, Sequence]) -> dict[str, int]:
    """The count sinks' table, its ``key`` and ``total`` columns: key -> total."""
    return {str(k): int(n) for k, n in sorted(zip(rows["key"], rows["total"]))}


def topic_records(bootstrap: str, topic: str) -> pd.DataFrame:
    """The output topic read back with read_committed: partition, offset, key (= id), value."""
    return _records(topics.read(bootstrap, topic))


def dedupe_by_id(records: pd.DataFrame) -> pd.DataFrame:
    """The downstream fix for an at-least-once sink: keep the first copy of each id."""
    return records.drop_duplicates(subset="id", keep="first", ignore_index=True)


def delivered(records: pd.DataFrame) -> list[Delivered]:
    """Rows or topic records as the lab-wide checker's observations, in observed order."""
    return [Delivered(str(i), k) for i, k in zip(records["id"], records["key"])]


def aborted_rows(bootstrap: str, input_topic: str, rows: pd.DataFrame) -> list[Delivered]:
    """The sink's rows that came from aborted transactions of the input: their input
    position (kafka_partition, kafka_offset) is one a read_committed reader never gets."""
    return aborted_of(rows, {(r.partition, r.offset) for r in topics.read(bootstrap, input_topic)})


def aborted_of(rows: pd.DataFrame, committed: set[tuple[int, int]]) -> list[Delivered]:
    """The rows whose input position is none of the ``committed`` ones (see aborted_rows)."""
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


@dataclass(frozen=True)
class SinkAudit:
    """The checker of a Spark scenario: what the run's query left in its sink of ``kind``
    against the run's inputs, and the counts per key against a Spark batch recount of the
    input topic (read_committed for a ``transactional_input``, whatever the stream read:
    aborted records are not part of it, and any in the sink are counted as such). The
    Kafka sink's topic at ``exactly_once``: after a downstream dedupe by id. The audited
    view goes to the run's facts as ``output`` (rows, topic records or totals per key), a
    Delta table's commits as ``table_history`` (a live run's).

    What it reads is kept in the run's history (``labkit.checking.reads``): the sink's
    table (``table-read``), the output topic (``read``), the recount and, for a Delta table
    or a transactional input, what Spark read back or the input's committed positions
    (``kept``); a stored run is re-checked from them. Where the sink and input are (the
    run's ``job`` fact: a table's name holds the run's id) is asked on a live run only."""

    scenario: str
    guarantee: str
    crash_at: str | None = None
    transactional_input: bool = False
    kind: str | None = None  # the sink's (labkit.spark.scenarios.PIPELINES); None: the job's

    # every read goes through labkit.checking.reads: a stored run re-checks it
    replayable: ClassVar[bool] = True

    def __call__(self, run: Any) -> Counted:
        def job() -> Any:  # a live run's query: where its sink and its input are
            return run.facts["job"]

        # a stored run holds no job: its checkers are built with the kind from its options
        kind = self.kind or job().sink.kind
        expected = reads.kept(run, "recount", lambda: recount(
            run.bootstrap, job().topic, source_options=(
                {"kafka.isolation.level": "read_committed"} if self.transactional_input
                else None)))
        if kind in COUNT_KINDS:
            got = reads.table(run, "sink", ("key", "total"),
                              lambda: (job().sink.db_url, job().sink.table), order_by="key")
            counts = counts_of(got)
            return Counted(audit_counts(self.scenario, self.guarantee, self.crash_at,
                                        len(run.inputs), expected, counts),
                           {"output": pd.DataFrame(sorted(counts.items()),
                                                   columns=["key", "total"])})
        if kind == "kafka":
            output = _records(reads.topic(run, "output").committed)
            if self.guarantee == "exactly_once":
                output = dedupe_by_id(output)
        elif kind in DELTA_KINDS:  # read back by Spark, in the order of the table's commits
            output = pd.DataFrame(reads.kept(run, "delta-table", lambda: delta_rows(run)))
        else:
            output = pd.DataFrame(reads.table(run, "sink", RECORD_COLUMNS, lambda: (
                job().sink.db_url, job().sink.table), order_by=SEQUENCE_COLUMN))
        aborted = None
        if self.transactional_input:
            committed = reads.kept(run, "input-committed", lambda: [
                [r.partition, r.offset] for r in topics.read(run.bootstrap, job().topic)])
            aborted = aborted_of(output, {(p, o) for p, o in committed})
        return Counted(audit_output(self.scenario, self.guarantee, self.crash_at, run.inputs,
                                    output, expected, aborted=aborted), {"output": output})


def delta_rows(run: Any) -> dict[str, list]:
    """The live run's Delta table's rows as Spark reads them back, column -> values (for a
    ``kept`` entry; its commits are a live run's fact: ``table_history``)."""
    output, table_history = tables.read_table(run.facts["job"].sink.path)
    # Delta's commit log as a DataFrame: not plain data, so the live run observes it
    run.observe(table_history=table_history)
    return {c: output[c].tolist() for c in output.columns}


def _records(recs: list) -> pd.DataFrame:
    """Topic records as ``topic_records`` shows them."""
    return pd.DataFrame([(r.partition, r.offset, r.key, r.value.get("key")) for r in recs],
                        columns=["partition", "offset", "id", "key"])
