"""The Spark experiments: one Structured Streaming query from Kafka into a sink, its driver
killed at a crash point and restarted from its checkpoint, the sink audited.

    run = experiments.run("spark-naive", guarantee="at_least_once",
                          crash_at="spark-after-sink-before-commit", pipeline=my_sink)

``pipeline`` is a learner's ``foreachBatch`` function (its cell's text runs in the Spark
driver); without it the scenario's own sink runs. ``query=`` is a learner's function that
builds and starts the query itself (``labkit.spark.scenarios.experiment``). What each scenario's sink does:
``labkit.spark.scenarios``.
"""
from __future__ import annotations

from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.spark import replay
from labkit.spark.runner import SPARK_CRASH_POINTS
from labkit.spark.scenarios import PIPELINES, SparkExperiment, experiment, validate

# A Spark driver answers "ready" within READY_TIMEOUT_S (180 s) of its start on a loaded
# machine; after that each micro-batch is an event. Longer than that first wait.
STALL_S = 240.0


def _body(name: str):
    def body(context, *, keep_topics: bool, **options) -> SparkExperiment:
        run = experiment(name, context.bootstrap, sink=context.pipeline, watch=context.watch,
                         **options)
        if not keep_topics:  # the terminal's run leaves nothing behind
            run.cleanup()
            run.delete_topics()
        return run
    return body


def _registered(name: str, guarantees: dict[str, str]) -> Experiment:
    choices = tuple(guarantees)
    return Experiment(
        name, f"Spark into a {' / '.join(dict.fromkeys(guarantees.values()))} sink, its driver "
        "killed and restarted from its checkpoint", _body(name), group="Spark",
        stall_s=STALL_S, pipeline="the foreachBatch sink function",
        crash_points=lambda guarantee=None: SPARK_CRASH_POINTS,
        check=lambda guarantee, crash_at, records, **_: validate(name, guarantee, crash_at,
                                                                records),
        options=(
            Option("guarantee", choices[0] if len(choices) == 1 else REQUIRED,
                   " | ".join(choices), choices, short="-g"),
            Option("crash_at", None, "a crash point (see `labkit crash-points`)",
                   SPARK_CRASH_POINTS),
            Option("records", 60, "how many input records (3 or more)", kind=int, short="-n"),
            Option("keep_topics", True, "keep the run's topics and directory", kind=bool,
                   cli_default=False),
            Option("resume", None, "where a restart starts: checkpoint | database",
                   ("checkpoint", "database"), cli=False),
            Option("spare", True, "start a spare Spark worker for the next run", kind=bool,
                   cli=False),
            Option("source_options", None, "the Kafka source's options", kind=dict, cli=False),
            Option("workdir", None, "where the checkpoint and tables go", cli=False),
            Option("on_event", None, "called with each batch event", kind=object, cli=False),
            Option("query", None, "a learner's function that builds and starts the query",
                   kind=object, cli=False),
        ))


for _name, _guarantees in PIPELINES.items():
    register(_registered(_name, _guarantees))


register(Experiment(
    "spark-replay", "Spark's sink crashed before its commit while the lookup changes: does "
    "the table match one processing?",
    lambda context, sink, **options: replay.experiment(context.bootstrap, sink,
                                                       transform=context.pipeline, **options),
    group="Spark", stall_s=STALL_S,
    pipeline="the transform of each micro-batch's rows (rows, threshold_table -> rows)",
    options=(
        Option("sink", REQUIRED, " | ".join(replay.SINKS), replay.SINKS),
        Option("records", 60, "how many input records", kind=int, short="-n"),
        Option("spare", True, "start a spare Spark worker for the next run", kind=bool,
               cli=False),
        Option("workdir", None, "where the checkpoint and tables go", cli=False),
        Option("on_event", None, "called with each batch event", kind=object, cli=False),
    )))
