"""Spark's real-time mode under a driver crash, against a micro-batch: the same Kafka-to-Kafka
query (Spark's official Kafka source and sink), its driver SIGKILLed mid-batch and restarted
on its checkpoint; the audit counts what was written twice, and after a dedupe by id.

    run = experiments.run("spark-realtime", trigger="5 seconds")     # the lab's query
    run = experiments.run("spark-realtime", pipeline=copy_query)     # the learner's, its trigger
    run.report.duplicated, run.deduped.exactly_once, run.latency["p50_ms"]

What each step does: ``labkit.spark.realtime``.
"""
from __future__ import annotations

from labkit.experiments.registry import Experiment, Option, register
from labkit.spark import realtime

STALL_S = 240.0  # a Spark worker's start on a loaded machine, then the query's events


def _run(context, *, trigger: str | None, rate: float, kill_after: float, after_kill: float,
         spare: bool, keep_topics: bool) -> realtime.RealtimeRun:
    if context.pipeline is not None and trigger is not None:
        raise ValueError("the learner's query sets its own trigger: leave trigger= out")
    query = context.pipeline or realtime.reference_query(trigger or "5 seconds")
    return realtime.experiment(context.bootstrap, query, rate=rate, kill_after=kill_after,
                               after_kill=after_kill, spare=spare, keep_topics=keep_topics)


register(Experiment(
    realtime.SCENARIO, "Spark's real-time mode or a micro-batch, Kafka to Kafka: the driver "
    "SIGKILLed mid-batch and restarted; latency and what the crash wrote twice",
    _run, group="Spark", stall_s=STALL_S,
    check=lambda rate, kill_after, after_kill, **_: realtime.check_sizes(rate, kill_after,
                                                                       after_kill),
    pipeline="the query function (Kafka source to Kafka sink, its own trigger)",
    text=lambda run: f"{run.summary()}\n{run.timeline()}",
    options=(
        Option("trigger", None, f"{realtime.MICRO_BATCH} | a real-time batch duration such as "
               "'5 seconds' (5 s or more; default '5 seconds'), for the lab's own query"),
        Option("rate", 100.0, "payments a second", kind=float),
        Option("kill_after", 2.5, "seconds after the query's first checkpoint when the driver "
               "is SIGKILLed", kind=float),
        Option("after_kill", 1.0, "seconds of payments after the kill", kind=float),
        Option("spare", False, "start a spare Spark worker for the next run", kind=bool,
               cli=False),
        Option("keep_topics", True, "keep the run's topics", kind=bool, cli_default=False),
    )))
