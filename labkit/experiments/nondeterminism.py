"""Non-determinism on replay, the Kafka side: consume-transform-produce with a lookup that
changes while the worker is down.

    run = experiments.run("kafka-replay", guarantee="exactly_once")
    run.mixed.valid, run.aborted_in_log, run.committed    # True, 10, [(id, version), ...]

The consume-transform-produce pipeline (labkit.pipelines.ctp) screens each batch with the
review threshold (labkit.pipelines.lookup), read when the batch is processed. The worker is
SIGKILLed after it produced its 2nd batch and before that batch's offsets were committed; while
it is down the threshold goes from V1 to V2; the restart processes that batch again, under V2.

- exactly_once: the killed attempt's transaction is aborted (the restart's
  init_transactions fences it), so a read_committed reader sees only the replay's output:
  one processing (``labkit.checking.checkers.single_processing``: mixed keys 0), while the log still
  holds the first attempt's records, aborted (``aborted_in_log`` > 0).
- at_least_once: the first attempt's output was delivered; the replay adds its own: payments
  with two different outcomes, no single processing (mixed keys > 0).

(labkit.spark.replay is the same experiment with Spark's sinks.)
"""
from __future__ import annotations

from typing import Any

from labkit.checking.checks import OneProcessing
from labkit.checking.record import Presentation
from labkit.experiments.context import RunContext
from labkit.experiments.parts import Topic, Workers, Workload
from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.faults.nemesis import Nemesis
from labkit.faults.process_faults import CrashAt
from labkit.pipelines import ctp, data
from labkit.pipelines.lookup import V1, V2, VERSION_FIELD, processing, set_threshold

SCENARIO = "kafka-replay"
# Where each guarantee's worker dies: its 2nd batch produced, its offsets not yet committed.
CRASH_AT = {"exactly_once": "after-send-offsets-before-commit",
            "at_least_once": "after-process-before-commit"}
CRASH_HIT, BATCH = 2, 10


def clients(run: RunContext) -> Workers:
    """One worker that looks the threshold up in the run's table, V1 until it is killed; V2
    while it is down, so its restart processes the batch again under V2."""
    lookup = str(run.workdir / "lookup.db")
    set_threshold(lookup, V1)
    return Workers(ctp.run, [dict(
        input_topic=run.topics["input"], output_topic=run.topics["output"],
        group_id=run.group_id, transactional_id=run.transactional_id(),
        guarantee=run.o.guarantee, batch_size=BATCH, lookup=lookup)],
        label=f"consume-transform-produce [{run.o.guarantee}]",
        on_crash=lambda: set_threshold(lookup, V2))


def summary(run: Any) -> str:
    """Stable text for notebooks and docs."""
    return (f"consume-transform-produce [{run.options['guarantee']}]: {len(run.committed)} "
            f"records read_committed, {run.aborted_in_log} aborted in the log, "
            f"{run.mixed.count} mixed keys -> "
            f"{'ONE processing' if run.mixed.valid else 'NO single processing'}")


register(Experiment(
    SCENARIO, "consume-transform-produce crashed in its 2nd batch while its lookup "
    "changes: does the output match one processing?",
    options=(Option("guarantee", REQUIRED, "exactly_once | at_least_once", tuple(CRASH_AT),
                    short="-g"),
             Option("records", 30, "how many input records", kind=int, short="-n")),
    workload=lambda o: Workload(f"{SCENARIO}-{o.guarantee}",
                                (Topic("input", loaded=True), Topic("output")),
                                data.generate(o.records, seed=0)),
    clients=clients,
    nemesis=lambda o: Nemesis(CrashAt(CRASH_AT[o.guarantee], CRASH_HIT)),
    checkers=lambda o: [OneProcessing(
        SCENARIO, o.guarantee, VERSION_FIELD, crash_at=CRASH_AT[o.guarantee],
        processings=lambda inputs: [processing(inputs, V1), processing(inputs, V2)])],
    presentation=Presentation(summary=summary, json_facts=("mixed_keys", "aborted_in_log"))))
