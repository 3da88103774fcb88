"""An experiment's checkers, as parts it composes: each reads what is observable after the
run (a topic, a table, a count per key) and they add up to the run's one AuditReport.

    checkers = (TopicAudit("consume-transform-produce", "exactly_once", crash_at="mid-batch"),
                HistoryFinding("zombie-write", zombie_writes))
    report, counted = compose(run, checkers)

One checker gives the report (the audit of the data); every other gives findings
(``labkit.checking.checkers.Result``) that join it and the one verdict. ``run`` is the
experiment's run: its ``bootstrap``, ``topics`` (by role), ``inputs`` and ``history``. A
checker writes nothing into the run: what it counted besides the report comes back with it
(``Counted``), and the runner adds it to the run's facts.

A checker whose class says ``replayable`` reads nothing outside the run's history (its
reads of Kafka and of tables go through ``labkit.checking.reads``): ``labkit check`` re-runs
it on a stored run. The others (Kafka read by code of their own, what a run's live parts
counted) are refused there, by name.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from labkit.checking import audit, checkers, history, reads
from labkit.checking.audit import AuditReport
from labkit.checking.checkers import EXAMPLES, Attempt, Result


class Checked(Protocol):
    """What a checker reads of the run (labkit.experiments.context.RunContext)."""

    experiment: str
    bootstrap: str
    topics: dict[str, str]
    inputs: list[dict]
    history: list[dict]


@dataclass(frozen=True)
class Counted:
    """A checker's report with what it counted besides (``facts``, for the run's record)."""

    report: AuditReport
    facts: dict[str, Any]


Checker = Callable[[Any], "AuditReport | Counted | list[Result]"]


@dataclass(frozen=True)
class TopicAudit:
    """The output topic as a downstream consumer reading with ``isolation`` sees it
    (``labkit.checking.audit.audit_read``), its read kept in the run's history
    (``labkit.checking.reads``); ``state_field``: also the last value per key against the
    input's count per key."""

    scenario: str
    guarantee: str
    crash_at: str | None = None
    fault: str | None = None
    role: str = "output"
    isolation: str = "read_committed"
    state_field: str | None = None
    # a run that may end before its app is done (the judge audits a stalled loop as it
    # stands): an input missing from the output that a restart of the group reads again is
    # unprocessed, not lost (labkit.checking.reads.restart_reads)
    restart_reads: bool = False

    # its only reads of Kafka go through labkit.checking.reads: a stored run re-checks it
    replayable: ClassVar[bool] = True

    def __call__(self, run: Checked) -> AuditReport:
        read = reads.topic(run, self.role)
        not_owed = reads.restart_reads(run) if self.restart_reads else frozenset()
        return audit.audit_read(read, run.inputs, self.scenario,
                                self.guarantee, crash_at=self.crash_at, fault=self.fault,
                                isolation=self.isolation, state_field=self.state_field,
                                not_owed=not_owed)


@dataclass(frozen=True)
class TableAudit:
    """A database sink's table: the rows that ended up there (``labkit.checking.audit``),
    its read kept in the run's history (``labkit.checking.reads.table``); ``db(run)`` says
    where the database is (a live run's only). ``counts``: a table of running counts per key
    too, ``(table, key column, count column)``, against the input's count per key."""

    scenario: str
    guarantee: str
    table: str
    db: Callable[[Any], str]
    crash_at: str | None = None
    fault: str | None = None
    counts: tuple[str, str, str] | None = None
    key_column: str = "key"
    order_by: str | None = None  # for a table that keeps no insertion order

    # its reads of the table go through labkit.checking.reads.table (kept in the history;
    # ``db`` is asked only on a live run): a stored run re-checks it
    replayable: ClassVar[bool] = True

    def __call__(self, run: Checked) -> AuditReport:
        def read(table: str, columns: Sequence[str], order_by: str | None) -> dict[str, list]:
            return reads.table(run, table, columns, lambda: (self.db(run), table),
                               order_by=order_by)

        return audit.audit_table(read, self.table, run.inputs, self.scenario,
                                 self.guarantee, crash_at=self.crash_at, fault=self.fault,
                                 counts=self.counts, key_column=self.key_column,
                                 order_by=self.order_by)


@dataclass(frozen=True)
class AcknowledgedWrites:
    """What a producer was told was written, against the log (Jepsen's acknowledged-writes
    check): an acknowledged id missing from the log is lost, an id there twice duplicated.
    A record that was not acknowledged is owed nothing (it may be there or not).

    ``acknowledged``: the fact the producer observed in the run's history (``observed``):
    each id its delivery reports acknowledged, with who acknowledged it (a broker, or
    None); ``read_from(run)``: the bootstrap
    to read the log from (default the run's; e.g. the new leader, while the old one still
    starts), a live run's only. Facts: ``in_log`` (ids), ``lost_acknowledged``,
    ``lost_acknowledged_by`` (who had acknowledged the lost ones, as text) and
    ``duplicated``."""

    scenario: str
    guarantee: str
    acknowledged: str = "acked_by"
    fault: str | None = None
    role: str = "output"
    read_from: Callable[[Any], str] | None = None

    # what the producer was told and the log both reach it through the history: a stored
    # run re-checks it
    replayable: ClassVar[bool] = True

    def __call__(self, run: Checked) -> Counted:
        acked = history.facts_of(reads.events(run)).get(self.acknowledged)
        if acked is None:
            raise ValueError(f"the run's history holds no {self.acknowledged!r}: the producer "
                             "under test observes what it was told (run.observe)")
        read = reads.topic(run, self.role, at=None if self.read_from is None
                           else lambda: self.read_from(run))
        # not transactional: read_uncommitted gets every record the log holds
        in_log = [r.value["id"] for r in read.everything]
        unique = set(in_log)
        lost = sorted(set(acked) - unique)
        duplicated = len(in_log) - len(unique)
        twice = [i for i, n in Counter(in_log).items() if n > 1]
        report = AuditReport(self.scenario, self.guarantee, fault=self.fault,
                             produced=len(acked), delivered_unique=len(acked) - len(lost),
                             lost=len(lost), duplicated=duplicated,
                             examples={k: v[:EXAMPLES] for k, v in
                                       (("lost", lost), ("duplicated", twice)) if v})
        return Counted(report, dict(
            in_log=len(unique), lost_acknowledged=len(lost),
            lost_acknowledged_by=dict(Counter(str(acked[i]) for i in lost)),
            duplicated=duplicated))


@dataclass(frozen=True)
class CountsAudit:
    """An output topic that holds running totals per key, not the records: the last
    ``field`` per key (read_committed) against the input's count per key (a shortfall is
    lost, an excess duplicated); ``aborted_in_log`` from reading it both ways. ``fault``
    may be a function of the run (a kill whose moment only the run knows): of its stored
    data only (its history, ``labkit.checking.reads.events``, and inputs), never its live
    parts, so that a stored run names it alike."""

    scenario: str
    guarantee: str
    field: str = "count"
    role: str = "output"
    fault: str | Callable[[Any], str] | None = None

    # its read goes through labkit.checking.reads, its fault is of the stored data: a stored
    # run re-checks it
    replayable: ClassVar[bool] = True

    def __call__(self, run: Checked) -> AuditReport:
        read = reads.topic(run, self.role)
        report = audit.check_counts(self.scenario, self.guarantee, len(run.inputs),
                                    audit.expected_counts(run.inputs),
                                    audit.last_value_per_key(read.committed, self.field),
                                    fault=self.fault(run) if callable(self.fault) else self.fault)
        report.aborted_in_log = len(read.everything) - len(read.committed)
        return report


@dataclass(frozen=True)
class OneProcessing:
    """A replay whose computation changed in between (a lookup edited while the pipeline
    was down): the output topic, read_committed, against the processings each record may
    have had (``labkit.checking.checkers.single_processing``); a key that matches none is
    mixed (``audit.mixed_report``). ``field``: what each output record's processing wrote
    (the lookup's version); ``processings(inputs)``: each possible processing (id -> value),
    in the order they can happen. The run's facts get ``committed`` (the (id, value) pairs
    a read_committed reader gets), ``aborted_in_log`` (records of the log it does not get),
    ``mixed`` (the Result) and ``mixed_keys``."""

    scenario: str
    guarantee: str
    field: str
    processings: Callable[[list[dict]], Sequence[Mapping[str, object]]]
    crash_at: str | None = None
    role: str = "output"

    # its read of the output goes through labkit.checking.reads: a stored run re-checks it
    replayable: ClassVar[bool] = True

    def __call__(self, run: Any) -> Counted:
        read = reads.topic(run, self.role)
        committed, in_log = read.committed, read.everything
        if untagged := [r.value.get("id") for r in committed if self.field not in r.value]:
            raise ValueError(f"{len(untagged)} output records have no {self.field!r} in their "
                             f"value (e.g. {untagged[0]}): the audit reads it, so the pipeline "
                             "must tag each record it writes")
        seen = [(r.value["id"], r.value[self.field]) for r in committed]
        mixed = checkers.single_processing([(r["id"], r["key"]) for r in run.inputs], seen,
                                           self.processings(run.inputs))
        report = audit.mixed_report(self.scenario, self.guarantee, self.crash_at,
                                    len(run.inputs), [i for i, _ in seen], mixed)
        return Counted(report, dict(committed=seen, aborted_in_log=len(in_log) - len(committed),
                                    mixed=mixed, mixed_keys=mixed.count))


@dataclass(frozen=True)
class QueueAudit:
    """A queue's work (a share group, KIP-932): the output holds one record per attempt
    (``id``, ``delivery_count``, ``outcome``: processed | released | rejected | ..., and
    ``consumer``). Duplicated: processed more than once; lost: never processed and not
    archived by the broker; archived (given up on: rejected, or released on its
    ``delivery_limit``-th delivery) is how a poison record ends, not a loss.
    Facts: ``attempts`` (``checkers.Attempt``, in log order), ``archived``,
    ``delivery_counts`` (highest count -> records), ``processed_by`` and ``out_of_order``
    (per consumer: records processed, and processed after a later one)."""

    scenario: str
    guarantee: str
    delivery_limit: int
    crash_at: str | None = None
    role: str = "output"

    # its read of the output goes through labkit.checking.reads: a stored run re-checks it
    replayable: ClassVar[bool] = True

    def __call__(self, run: Checked) -> Counted:
        attempts = [Attempt(str(r.value["id"]), str(r.value.get("consumer", "")),
                            r.value.get("delivery_count"), r.value.get("outcome", "processed"))
                    for r in reads.topic(run, self.role).committed]
        ids = [r["id"] for r in run.inputs]
        archived = set(checkers.archived_ids(ids, attempts, self.delivery_limit))
        processed = [a.id for a in attempts if a.outcome == "processed"]
        results = [checkers.lost_write([i for i in ids if i not in archived], processed),
                   checkers.duplicate(ids, processed)]
        report = audit.report_of(self.scenario, self.guarantee, results, produced=len(ids),
                                 delivered_unique=len(set(ids) & set(processed)),
                                 crash_at=self.crash_at)
        by = Counter(a.consumer for a in attempts if a.outcome == "processed")
        return Counted(report, dict(
            attempts=attempts, archived=len(archived),
            delivery_counts=checkers.delivery_counts(attempts),
            processed_by=dict(sorted(by.items())),
            out_of_order={c: r.count for c, r in
                          checkers.order_per_consumer(ids, attempts).items()}))


@dataclass(frozen=True)
class Finding:
    """Extra findings from the run: ``check(run)`` returns one Result (or None: nothing
    to judge), named like the audit's (a Jepsen-style anomaly name)."""

    check: Callable[[Any], Result | None]

    def __call__(self, run: Checked) -> list[Result]:
        found = self.check(run)
        return [] if found is None else [found]


def compose(run: Checked, checkers: Sequence[Checker]) -> tuple[AuditReport, dict[str, Any]]:
    """Every checker's result in one report: the one AuditReport, the others' findings
    joined to it (so to its verdict and anomalies); and what the checkers counted besides
    (``Counted``), for the runner to add to the run's facts."""
    results, counted = [], {}
    for checker in checkers:
        result = checker(run)
        if isinstance(result, Counted):
            counted.update(result.facts)
            result = result.report
        results.append(result)
    reports = [r for r in results if isinstance(r, AuditReport)]
    if len(reports) != 1:
        raise ValueError(f"an experiment needs exactly one checker that audits its data, "
                         f"not {len(reports)}")
    report = reports[0]
    for found in results:
        if not isinstance(found, AuditReport):
            report.extra.extend(found)
    return report, counted
