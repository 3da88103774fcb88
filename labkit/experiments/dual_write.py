"""The dual write: a service stores payments in PostgreSQL and sends their events to Kafka,
one after the other, and is SIGKILLed between the two; and the outbox, its way out.

    run = experiments.run("dual-write", order="table-first")    # events lost
    run = experiments.run("dual-write", order="kafka-first")    # events duplicated
    run = experiments.run("dual-write", order="outbox")         # events as outbox rows
    run.report.lost, run.table_rows, run.crashed

The service (``labkit.pipelines.dual_write``, or the learner's function: it gets
``bootstrap``, ``dsn``, ``topic`` and ``payments``) runs as one supervised process, killed
between its two writes on its second batch and started again; it skips what its table
already holds. The events are audited where they are: the topic as downstream reads it, or
(``outbox``) the outbox table's rows, which Debezium would stream (the ``outbox``
experiment). The payments table's rows are a fact.
"""
from __future__ import annotations

from labkit.checking.checks import TableAudit, TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workers, Workload
from labkit.experiments.db import Schema
from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.faults.nemesis import Nemesis
from labkit.faults.process_faults import CrashAt
from labkit.pipelines import data, dual_write, learner
from labkit.storage.db import Database

NAME = "dual-write"
GUARANTEES = {"table-first": "at_most_once", "kafka-first": "at_least_once",
              "outbox": "exactly_once"}
CRASH_HIT = 2  # the second batch: one batch is stored and announced before the crash


def _tables(run, dsn: str) -> str:
    outbox = run.o.order == "outbox"
    dual_write.create_table(dsn, outbox=outbox)
    return "tables payments and outbox" if outbox else "table payments"


def _clients(run) -> Workers:
    dsn, outbox = run.db.dsn, run.o.order == "outbox"
    member = {"dsn": dsn, "payments": run.inputs,
              **({} if outbox else {"topic": run.topics["events"]})}
    if run.pipeline is None:
        return Workers(dual_write.run, [{**member, "order": run.o.order}],
                       label=f"{NAME} [{run.o.order}]")
    learner.check_parameters(run.pipeline, {"bootstrap", *member})  # what it is given
    return Workers(learner.run_code, [{**member, "code": learner.code_of(run.pipeline),
                                       "function": run.pipeline.__name__}],
                   label=f"{NAME} [{run.o.order}]")


def _point(o) -> str | None:
    return dual_write.CRASH_POINTS[o.order][0] if o.crash else None


def _facts(run) -> dict:
    with Database(run.db.dsn, readonly=True) as db:
        (rows, unique), = db.query("SELECT COUNT(*), COUNT(DISTINCT id) FROM payments")
    return {"table_rows": rows, "table_unique": unique, "crashed": run.facts["run"].crashed_at,
            "attempts": run.facts["run"].attempts, "errors": run.facts["run"].failures}


def _checkers(o) -> list:
    if o.order == "outbox":  # the events are the outbox's rows (it keeps no insertion order)
        return [TableAudit(NAME, GUARANTEES[o.order], "outbox", db=lambda run: run.db.dsn,
                           crash_at=_point(o), key_column="aggregateid", order_by="id")]
    return [TopicAudit(NAME, GUARANTEES[o.order], _point(o), role="events")]


def _summary(run) -> str:
    return (f"{run.report.summary()}\n  the payments table: {run.table_rows} rows, "
            f"{run.table_unique} payments")


register(Experiment(
    NAME, "a service writes its table and Kafka one after the other, killed in between: "
    "events lost or duplicated; or its events as outbox rows", group="PostgreSQL",
    pipeline="the service (as labkit.pipelines.dual_write.run)",
    crash_points=lambda order=None: (dual_write.CRASH_POINTS[order] if order else
                                     tuple(p for ps in dual_write.CRASH_POINTS.values()
                                           for p in ps)),
    options=(
        Option("order", REQUIRED, " | ".join(f"{k}: {v}" for k, v in dual_write.ORDERS.items()),
               tuple(dual_write.ORDERS), short="-o"),
        Option("crash", True, "SIGKILL the service between its two writes, on its 2nd batch",
               kind=bool),
        common.records(40, "payments", minimum=20, why="batches of 10: the crash comes on the second"),
        common.seed("the payments"),
        common.keep_topics(False)),
    workload=lambda o: Workload(f"dual-write-{o.order}",
                                (Topic("events"),) if o.order != "outbox" else (),
                                data.generate(o.records, seed=o.seed)),
    db=lambda o: Schema(_tables), clients=_clients,
    nemesis=lambda o: Nemesis(*([CrashAt(_point(o), CRASH_HIT)] if o.crash else [])),
    checkers=_checkers,
    facts=_facts, presentation=Presentation(summary=_summary, json_facts=(
        "table_rows", "table_unique", "crashed", "attempts"))))
