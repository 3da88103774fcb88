"""Spark's real-time mode under a driver crash, against a micro-batch: the same Kafka-to-Kafka
query (Spark's official Kafka source and sink), its driver SIGKILLed mid-batch and restarted
on its checkpoint; the audit counts what was written twice, and after a dedupe by id.

    run = experiments.run("spark-realtime", trigger="5 seconds")     # the lab's query
    run = experiments.run("spark-realtime", pipeline=copy_query)     # the learner's, its trigger
    run.report.duplicated, run.deduped.exactly_once, run.latency["p50_ms"]

The composition: payments for the producer to write at ``rate`` a second (the workload), the
query in a Spark worker (``RealtimeCopy``), its driver SIGKILLed ``kill_after`` seconds after
its first checkpoint (``KillDriver``), both topics audited (``audit_copy``). What each step
does: ``labkit.spark.realtime``.
"""
from __future__ import annotations

from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import Experiment, Option, register
from labkit.faults.nemesis import Nemesis, after, on
from labkit.pipelines import data
from labkit.spark import realtime
from labkit.spark.clients import KillDriver

STALL_S = 240.0  # a Spark worker's start on a loaded machine, then the query's events


def _payments(o) -> list[dict]:
    # more than the run can write: the producer stops at the kill + after_kill
    return data.generate(int(o.rate * (2 * realtime.START_S + o.after_kill)), seed=0)


register(Experiment(
    realtime.SCENARIO, "Spark's real-time mode or a micro-batch, Kafka to Kafka: the driver "
    "SIGKILLed mid-batch and restarted; latency and what the crash wrote twice",
    group="Spark", stall_after=STALL_S, check=realtime.check_rate,
    check_pipeline=realtime.check_learner_query,
    pipeline="the query function (Kafka source to Kafka sink, its own trigger)",
    text=lambda run: f"{run.summary()}\n{run.timeline()}",
    options=(
        Option("trigger", None, f"{realtime.MICRO_BATCH} | a real-time batch duration such as "
               "'5 seconds' (5 s or more; default '5 seconds'), for the lab's own query"),
        Option("rate", 100.0, "payments a second", kind=float, minimum=1),
        Option("kill_after", 2.5, "seconds after the query's first checkpoint when the driver "
               "is SIGKILLed", kind=float, minimum=0),
        Option("after_kill", 1.0, "seconds of payments after the kill", kind=float, minimum=0),
        Option("spare", False, "start a spare Spark worker for the next run", kind=bool,
               cli=False),
        common.keep_topics(True),
    ),
    workload=lambda o: Workload("spark-rt", (Topic("input", realtime.PARTITIONS),
                                             Topic("output", realtime.PARTITIONS)), _payments(o)),
    clients=lambda run: realtime.RealtimeCopy(
        run.pipeline or realtime.reference_query(run.o.trigger or "5 seconds"),
        rate=run.o.rate, after_kill=run.o.after_kill, spare=run.o.spare,
        kill_within_s=run.o.kill_after + realtime.START_S),
    nemesis=lambda o: Nemesis(KillDriver(after(o.kill_after, since=on("checkpoint")))),
    checkers=lambda o: [realtime.audit_copy],
    facts=realtime.facts,
    presentation=Presentation(summary=realtime.summary, json=realtime.to_dict)))
