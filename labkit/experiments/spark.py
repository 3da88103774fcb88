"""The Spark experiments: one Structured Streaming query from Kafka into a sink, its driver
killed at a crash point and restarted from its checkpoint, the sink audited.

    run = experiments.run("spark-naive", guarantee="at_least_once",
                          crash_at="spark-after-sink-before-commit", pipeline=my_sink)
    run.report; run.run.timeline; run.run.attempts; run.job.checkpoint; run.output; run.inputs

``pipeline`` is a learner's ``foreachBatch`` function (its cell's text runs in the Spark
driver); without it the scenario's own sink runs. ``query=`` is a learner's function that
builds and starts the query itself. Each is the same composition: a workload (generated
payments on a 2-partition input topic, some written in aborted transactions for the
``spark-txn-input`` scenarios), the query as its clients (``labkit.spark.clients.SparkQuery``:
restarted until the input is done), a crash point armed in its first attempt (``CrashAt``)
and the audit of its sink (``labkit.spark.check.SinkAudit``). What each scenario's sink
does: ``labkit.spark.scenarios``. ``spark-replay`` adds a lookup that changes while the
query is down (``labkit.spark.replay``).
"""
from __future__ import annotations

from functools import partial

from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.faults.nemesis import Nemesis, on
from labkit.faults.process_faults import CrashAt
from labkit.pipelines import data
from labkit.spark import replay
from labkit.spark.check import SinkAudit
from labkit.spark.clients import SparkQuery
from labkit.spark.runner import SPARK_CRASH_POINTS
from labkit.spark.scenarios import (CRASH_HIT, PARTITIONS, PIPELINES, TXN_INPUT, check_options,
                                    check_sink, load_transactional, resume, stream_job)

# A Spark driver answers "ready" within READY_TIMEOUT_S (180 s) of its start on a loaded
# machine; after that each micro-batch is an event. Longer than that first wait.
STALL_S = 240.0


def _workload(name: str, o) -> Workload:
    records = data.generate(o.records, seed=0)
    output = (Topic("output"),) if PIPELINES[name][o.guarantee] == "kafka" else ()
    if name in TXN_INPUT:  # only the committed records are input; aborted ones must not show
        return Workload(name, (Topic("input", PARTITIONS, create=False), *output), records,
                        load=lambda run: load_transactional(run.bootstrap, run.topics["input"],
                                                            records)[0])
    return Workload(name, (Topic("input", PARTITIONS, loaded=True), *output), records)


def _query(job, resume_from: str, run) -> SparkQuery:
    return SparkQuery(job, resume=resume_from, spare=run.o.spare, on_event=run.o.on_event,
                      workdir=run.o.workdir)


def _crash(o) -> Nemesis:
    return Nemesis(*([CrashAt(o.crash_at, hit=CRASH_HIT)] if o.crash_at else []))


SPARK_OPTIONS = (
    Option("spare", True, "start a spare Spark worker for the next run", kind=bool, cli=False),
    Option("workdir", None, "where the checkpoint and tables go (default: the run's "
           "directory)", cli=False),
    Option("on_event", None, "called with each batch event", kind=object, cli=False),
)


def _registered(name: str, guarantees: dict[str, str]) -> Experiment:
    choices = tuple(guarantees)
    return Experiment(
        name, f"Spark into a {' / '.join(dict.fromkeys(guarantees.values()))} sink, its driver "
        "killed and restarted from its checkpoint", group="Spark",
        stall_after=STALL_S, pipeline="the foreachBatch sink function",
        crash_points=lambda guarantee=None: SPARK_CRASH_POINTS,
        check=partial(check_options, name), check_pipeline=check_sink,
        options=(
            Option("guarantee", choices[0] if len(choices) == 1 else REQUIRED,
                   " | ".join(choices), choices, short="-g"),
            Option("crash_at", None, "a crash point (see `labkit crash-points`)",
                   SPARK_CRASH_POINTS),
            common.records(60, minimum=3),
            common.keep_topics(True),
            Option("keep_workdir", True, "keep the run's directory (its checkpoint and tables)",
                   kind=bool, cli_default=False),
            Option("resume", None, "where a restart starts: checkpoint | database",
                   ("checkpoint", "database"), cli=False),
            Option("source_options", None, "the Kafka source's options", kind=dict, cli=False),
            Option("query", None, "a learner's function that builds and starts the query",
                   kind=object, cli=False),
            *SPARK_OPTIONS),
        workload=partial(_workload, name),
        clients=lambda run: _query(partial(stream_job, name, run.o), resume(name, run.o), run),
        nemesis=_crash,
        checkers=lambda o: [SinkAudit(name, o.guarantee, o.crash_at, name in TXN_INPUT,
                                      kind=PIPELINES[name][o.guarantee])],
        facts=lambda run: {"inputs": run.inputs})


for _name, _guarantees in PIPELINES.items():
    register(_registered(_name, _guarantees))


register(Experiment(
    "spark-replay", "Spark's sink crashed before its commit while the lookup changes: does "
    "the table match one processing?", group="Spark", stall_after=STALL_S,
    pipeline="the transform of each micro-batch's rows (rows, threshold_table -> rows)",
    check_pipeline=replay.check_transform,
    options=(
        Option("sink", REQUIRED, " | ".join(replay.SINKS), replay.SINKS),
        common.records(60),
        *SPARK_OPTIONS),
    workload=lambda o: Workload(f"replay-{o.sink}", (Topic("input", replay.PARTITIONS,
                                                           loaded=True),),
                                data.generate(o.records, seed=0)),
    clients=lambda run: _query(partial(replay.stream_job, run.o),
                               "database" if run.o.sink == "transactional" else "checkpoint", run),
    nemesis=lambda o: Nemesis(CrashAt(replay.CRASH_AT, hit=replay.CRASH_HIT),
                              replay.ThresholdChange(on("crashed"))),
    checkers=lambda o: [replay.ReplayAudit(o.sink)],
    facts=replay.facts,
    presentation=Presentation(summary=replay.summary, json_facts=("mixed_keys",))))
