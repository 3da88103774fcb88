"""Kafka into a database: a plain consumer writing payments to PostgreSQL, as a group of
instances, crashed and rebalanced, audited by the table.

    run = experiments.run("kafka-to-database", approach="insert-first",
                          crash_at="after-process-before-commit")
    run = experiments.run("kafka-to-database", approach="offsets-in-database",
                          crash_at="in-transaction-before-commit,after-commit",
                          pipeline=my_consumer)       # the learner's loop
    run.report.duplicated, run.offsets_table, run.group_offsets, run.crashed

The consumer (the learner's function, or the lab's reference ``labkit.pipelines.
kafka_to_database`` taking ``approach``) runs as ``instances`` members of one group over
``partitions`` partitions, each a supervised process that runs until the lab stops it; each
gets ``bootstrap``, ``input_topic``, ``group_id``, ``instance_id`` and ``dsn`` (the lab's
PostgreSQL, in a schema of the run's own: its tables made there before the consumers start,
dropped after the run unless ``keep_database``). The input is written once the group has
formed, half of it at first: each instance armed with a crash point (``crash_at``: one, or
one per instance) is SIGKILLed there on its first batch and started again. With
``rebalance``, a member joins the group once the first half is written, the group
rebalances, and the second half goes to three members. The run
is done when the input is consumed (as the group's committed offsets or the database's own
offsets table say: ``labkit.checking.table_progress``) and the table has been quiet; then
the ``payments`` table is audited (``totals``: the running count per account too).
"""
from __future__ import annotations

from labkit.checking.checks import TableAudit
from labkit.checking.record import Presentation
from labkit.checking.table_progress import TableProgress
from labkit.experiments import options as common
from labkit.experiments.app_run import AppClients
from labkit.experiments.feed import group_formed, write_input
from labkit.experiments.judge_findings import raised_in
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.db import Schema
from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.faults.crashpoints import CRASH_POINTS, named, per_instance
from labkit.faults.nemesis import Nemesis, on
from labkit.faults.process_faults import CrashAt, Join
from labkit.kafka.inspect import Inspector
from labkit.pipelines import data, learner
from labkit.pipelines import kafka_to_database as sink
from labkit.storage.db import Database

NAME = "kafka-to-database"
SETTINGS = ("bootstrap", "input_topic", "group_id", "instance_id", "dsn")
REFERENCE = "labkit.pipelines.kafka_to_database:run"
JOINED = "a member joins the group"
# The table quiet this long, the input consumed: done. Each row is durable when written (a
# consumer that commits first writes its batch's rows within milliseconds after).
QUIET_S = 1.0


def _member(run, i: int) -> dict:
    """Instance ``i``'s settings: its own static member id, the run's database."""
    settings = {"input_topic": run.topics["input"], "group_id": run.group_id,
                "instance_id": f"{run.base}-{i}", "dsn": run.db.dsn}
    if run.pipeline is None:
        return {**settings, "approach": run.o.approach, "totals": run.o.totals}
    learner.check_parameters(run.pipeline, set(SETTINGS))
    return {**settings, "code": learner.code_of(run.pipeline), "function": run.pipeline.__name__}


def _tables(run, dsn: str) -> str:
    sink.create_tables(dsn, run.topics["input"], run.o.partitions,
                       unique_ids=run.o.approach == "idempotent")
    return "tables payments, accounts and offsets"


def _clients(run) -> AppClients:
    """The consumers as supervised processes (their tables made by the run's db part)."""
    o = run.o
    worker = REFERENCE if run.pipeline is None else learner.run_code
    return AppClients(None, lambda: {"bootstrap": run.client_bootstrap}, worker=worker,
                      members=[_member(run, i) for i in range(o.instances)],
                      timeout_s=o.timeout, label=f"{NAME} [{o.approach}]", feed=_feed,
                      restart_exited=True, progress=_progress, quiet_s=QUIET_S)


def _progress(run) -> TableProgress:
    return TableProgress(run.bootstrap, run.topics["input"], run.group_id, db=run.db.dsn,
                         rows=sink.ROWS, positions=sink.POSITIONS, history_file=run.history_file)


def _feed(run) -> None:
    """Half the input once the group has formed (each armed instance has partitions, so
    reaches its crash point); with ``rebalance`` the member joins then (an event its fault
    waits for), and the rest is written once the group has it."""
    group_formed(run, run.o.instances)
    half = len(run.inputs) // 2
    write_input(run, run.inputs[:half])
    run.step(f"input: the first {half} records written")
    run.event("input-written", half=1)
    if run.o.rebalance:
        group_formed(run, run.o.instances + 1)
    write_input(run, run.inputs[half:])
    run.step(f"input: the other {len(run.inputs) - half} records written")
    run.event("input-written", half=2)


def _nemesis(o) -> Nemesis:
    faults = [CrashAt(point, hit=1, instance=i) for i, point in enumerate(named(o.crash_at))]
    if o.rebalance:
        faults.append(Join(on("input-written", half=1), settings=_member, name=JOINED))
    return Nemesis(*faults)


def _checkers(o) -> list:
    return [TableAudit(NAME, sink.GUARANTEES[o.approach], "payments",
                       db=lambda run: run.db.dsn, crash_at=",".join(named(o.crash_at))
                       or None, fault=JOINED if o.rebalance else None,
                       counts=sink.COUNTS if o.totals else None, key_column="account")]


def _check(approach, crash_at, instances, **_) -> None:
    off_path = [p for p in per_instance(crash_at, instances)
                if p not in sink.CRASH_POINTS[approach]]
    if off_path:
        raise ValueError(f"crash point {off_path[0]!r} is not on the path of {approach}. "
                         f"Valid crash points here: {', '.join(sink.CRASH_POINTS[approach])}")


def _facts(run) -> dict:
    app: AppClients = run.clients
    with Database(run.db.dsn, readonly=True) as db:
        stored = dict(db.query("SELECT part, off FROM offsets WHERE topic = ? ORDER BY part",
                               (run.topics["input"],)))
    with Inspector(run.bootstrap) as inspector:
        committed = inspector.group_offsets(run.topics["input"], [run.group_id])
    return {"offsets_table": stored, "group_offsets": committed.get(run.group_id, {}),
            "crashed": app.pool.result.crashed_at,
            "faults_fired": [f.what for f in run.fired_faults],
            "restarts": app.pool.result.attempts - len(app.pool.instances),
            "errors": [{"instance": f["instance"], "attempt": f["attempt"],
                        "raised": raised_in(f["log"])} for f in app.pool.result.failures],
            "seconds": app.seconds, "waited": app.waited,
            "database": run.db.dsn if run.o.keep_database else None}


def _summary(run) -> str:
    lines = [run.report.summary()]
    lines += [f"  fault: {what}" for what in run.faults_fired]
    lines += [f"  instance {e['instance']} raised {e['raised']}" for e in run.errors]
    return "\n".join(lines)


register(Experiment(
    NAME, "a consumer writing payments to PostgreSQL, as a group: crashed, rebalanced, "
    "audited by the table", group="PostgreSQL", crash_points=lambda approach=None: (
        sink.CRASH_POINTS[approach] if approach else tuple(
            p for p in CRASH_POINTS if any(p in ps for ps in sink.CRASH_POINTS.values()))),
    pipeline="the consumer (as labkit.pipelines.kafka_to_database.run)", options=(
        Option("approach", REQUIRED, " | ".join(f"{k}: {v}" for k, v in
                                                 sink.APPROACHES.items()),
               tuple(sink.APPROACHES), short="-a"),
        Option("crash_at", None, "the crash point, or one per instance (a,b: instance 0 at "
               "a, instance 1 at b), each on the instance's first batch"),
        Option("rebalance", True, "a member joins the group once half the input is written",
               kind=bool),
        Option("totals", False, "keep and audit a running count of payments per account",
               kind=bool),
        Option("instances", 2, "consumers in one group", kind=int, minimum=1),
        Option("partitions", 3, "partitions of the input", kind=int, minimum=1),
        common.records(80, minimum=20, why="half of them written before the rebalance, a batch of 10 for each "
                   "instance's first crash"),
        common.seed(),
        common.timeout(120.0),
        Option("keep_database", False, "keep the run's tables until the lab's PostgreSQL "
               "stops (the DSN that finds them: the fact 'database')", kind=bool),
        common.keep_topics(False),
        Option("keep_workdir", False, "keep the run's directory (the instances' logs)",
               kind=bool, cli=False)),
    workload=lambda o: Workload(f"k2db-{o.approach}", (Topic("input", o.partitions),),
                                data.generate(o.records, seed=o.seed,
                                              keys=data.keys_for(o.partitions))),
    check=_check, db=lambda o: Schema(_tables, keep=o.keep_database), clients=_clients, nemesis=_nemesis, checkers=_checkers, facts=_facts,
    presentation=Presentation(summary=_summary, json_facts=(
        "offsets_table", "group_offsets", "crashed", "faults_fired", "errors", "seconds"))))
