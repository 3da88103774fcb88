"""Non-determinism on replay, the Kafka side: consume-transform-produce with a lookup that
changes while the worker is down.

    run = experiments.run("kafka-replay", guarantee="exactly_once", pipeline=review_service)
    run.mixed.valid, run.aborted_in_log, run.committed    # True, 10, [(id, version), ...]

The loop screens each batch with the review threshold (labkit.pipelines.lookup), read when
the batch is processed: the learner's (``pipeline=``: notebook 08d's is the production loop,
``labkit.pipelines.production_loop``, with the screening added; it names what it needs of
``SETTINGS``, ``threshold_table`` the lookup's file, and runs until it is told to stop), or
without one the lab's consume-transform-produce pipeline (labkit.pipelines.ctp,
``lookup=``). The worker is SIGKILLed at ``CRASH_AT`` in its 2nd batch, its output produced
and its offsets not yet committed; while it is down the threshold goes from V1 to V2; the
restart processes that batch again, under V2. A learner's loop is stopped (SIGTERM: the
production loop finishes its batch and leaves its group) once its group's committed offsets
reach the input's end.

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
from labkit.checking.group_progress import GroupProgress
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.context import RunContext
from labkit.experiments.parts import Topic, Workers, Workload
from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.faults.background import Background
from labkit.faults.nemesis import Nemesis
from labkit.faults.process_faults import CrashAt
from labkit.pipelines import ctp, data, learner
from labkit.pipelines.lookup import V1, V2, VERSION_FIELD, processing, set_threshold

SCENARIO = "kafka-replay"
# Where each guarantee's worker dies: its 2nd batch produced, its offsets not yet committed.
CRASH_AT = {"exactly_once": "after-send-offsets-before-commit",
            "at_least_once": "after-process-before-commit"}
CRASH_HIT, BATCH = 2, 10
# What a learner's loop may name (the production loop's settings, and the lookup's file);
# it gets only those it names.
SETTINGS = frozenset({"bootstrap", "input_topic", "output_topic", "group_id",
                      "transactional_id", "instance_id", "group_protocol", "threshold_table"})
# A learner's loop commits its input's end within this, its restart after the kill included.
LOOP_S = 180.0


def check_loop(loop: Any, o: Any) -> None:
    """A learner's loop, before anything starts: it names only what the lab gives, its
    cell's text is readable, and it passes the crash point its guarantee is killed at."""
    learner.check_parameters(loop, set(SETTINGS))
    learner.code_of(loop)
    point = CRASH_AT[o.guarantee]
    if point not in learner.crash_points_in(loop):
        raise learner.LearnerCodeError(
            f"{loop.__name__}() never calls crash_point({point!r}): the run kills it there in "
            "its 2nd batch (its output produced, its offsets not yet committed); keep that "
            "line where the production loop has it")


def clients(run: RunContext) -> Workers:
    """One worker that looks the threshold up in the run's table, V1 until it is killed; V2
    while it is down, so its restart processes the batch again under V2."""
    lookup = str(run.workdir / "lookup.db")
    set_threshold(lookup, V1)
    label = f"consume-transform-produce [{run.o.guarantee}]"
    if run.pipeline is not None:  # the learner's loop, sent as the text of its cell
        member = dict(input_topic=run.topics["input"], output_topic=run.topics["output"],
                      group_id=run.group_id, transactional_id=run.transactional_id(),
                      instance_id=f"{run.base}-0", group_protocol="classic",
                      threshold_table=lookup, code=learner.code_of(run.pipeline),
                      function=run.pipeline.__name__)
        return Workers(learner.run_code, [member], label=label, script=_until_committed,
                       on_crash=lambda: set_threshold(lookup, V2))
    return Workers(ctp.run, [dict(
        input_topic=run.topics["input"], output_topic=run.topics["output"],
        group_id=run.group_id, transactional_id=run.transactional_id(),
        guarantee=run.o.guarantee, batch_size=BATCH, lookup=lookup)],
        label=label, on_crash=lambda: set_threshold(lookup, V2))


def _until_committed(run: RunContext, app: Background) -> None:
    """A loop that runs until it is told to stop, as a service does, is told (the pool's
    SIGTERM when this returns) once its group's committed offsets reach the input's end:
    nothing is left that a restart would read again."""
    with GroupProgress(run.bootstrap, run.topics["input"], None, run.group_id,
                       history_file=run.history_file) as watch:
        def consumed() -> bool:
            done, end, _ = watch.sample()
            return watch.ok and done >= end

        app.wait_for(consumed, "the loop to commit its input's end", LOOP_S)


def summary(run: Any) -> str:
    """Stable text for notebooks and docs."""
    return (f"consume-transform-produce [{run.options['guarantee']}]: {len(run.committed)} "
            f"records read_committed, {run.aborted_in_log} aborted in the log, "
            f"{run.mixed.count} mixed keys -> "
            f"{'ONE processing' if run.mixed.valid else 'NO single processing'}")


register(Experiment(
    SCENARIO, "consume-transform-produce crashed in its 2nd batch while its lookup "
    "changes: does the output match one processing?",
    pipeline="the consume-transform-produce loop (as labkit.pipelines.production_loop."
    "fee_service, with threshold_table)", check_pipeline=check_loop,
    options=(Option("guarantee", REQUIRED, "exactly_once | at_least_once", tuple(CRASH_AT),
                    short="-g"),
             common.records(30)),
    workload=lambda o: Workload(f"{SCENARIO}-{o.guarantee}",
                                (Topic("input", loaded=True), Topic("output")),
                                data.generate(o.records, seed=0)),
    clients=clients,
    nemesis=lambda o: Nemesis(CrashAt(CRASH_AT[o.guarantee], CRASH_HIT)),
    checkers=lambda o: [OneProcessing(
        SCENARIO, o.guarantee, VERSION_FIELD, crash_at=CRASH_AT[o.guarantee],
        processings=lambda inputs: [processing(inputs, V1), processing(inputs, V2)])],
    presentation=Presentation(summary=summary, json_facts=("mixed_keys", "aborted_in_log"))))
