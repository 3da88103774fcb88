"""A batch slower than transaction.timeout.ms: the coordinator aborts its transaction, and
the app learns it only at its next write or commit, as an error it cannot recover from.

    run = experiments.run("txn-timeout")        # on the lab cluster
    run.errors                                  # ['_FENCED (fatal)'], as librdkafka reports it
    run.report.lost, run.report.duplicated      # 0, 0 (read_committed)
    run.report.aborted_in_log                   # 10: the slow batch, aborted by the coordinator

The app is notebook 05b's loop (``labkit.pipelines.fee_loop.copy_fees``): commit errors
handled as the client classifies them. Its transaction coordinator aborts any transaction
open longer than the producer's ``transaction.timeout.ms`` and bumps the producer's epoch,
so to librdkafka the producer is fenced, as by a newer instance (the error says so): fatal.
The app does what a fatal error asks: a new producer with the same transactional.id, the
consumer back at its committed offsets, the batch processed again. The slow processing is
the lab's fault: batch 2 waits until the coordinator's ABORT marker is in the output (its
last stable offset back at the high watermark), so the run lasts as long as the broker
takes, no more.

``cut=True``: batch 2 is not slow; its commit is cut off instead. The producer talks to the
broker through the lab's fault proxy, which holds its EndTxn (and everything behind it) until
the coordinator has aborted the transaction for its timeout, then lets it through: a client
partitioned from its transaction coordinator between produce and commit. A read_committed
reader is asked what it sees meanwhile.
"""
from __future__ import annotations

from typing import Any

from labkit.checking.checks import TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import Experiment, Option, register
from labkit.faults.nemesis import Nemesis, Observe, Until, WaitUntil, on
from labkit.faults.wire_faults import HoldRequests
from labkit.kafka import topics
from labkit.kafka.inspect import Inspector
from labkit.pipelines import data
from labkit.pipelines.fee_loop import BATCH, FeeLoop, markers_written

SCENARIO = "txn-timeout"
TIMEOUT_MS = 3000  # the producer's transaction.timeout.ms: short, so the lesson waits seconds
SLOW_BATCH = 2  # the batch (from 1) whose processing outlasts it
# The coordinator looks for expired transactions every
# transaction.abort.timed.out.transaction.cleanup.interval.ms (Kafka's default 10 s; the
# lab's broker 1 s): the slow batch waits up to this long for the abort.
ABORT_WAIT_S = 60

ABORTED = Until(lambda run: markers_written(run.bootstrap, run.topics["output"]),
                f"the coordinator to abort batch {SLOW_BATCH}'s transaction", ABORT_WAIT_S)


def readers_see(when: str, log: bool = False):
    """What a read_committed reader of the output sees (and, ``log``, the log holds)."""
    def look(run: Any) -> dict:
        output = run.topics["output"]
        seen = {f"visible_{when}": len(topics.read(run.bootstrap, output))}
        if log:
            seen["open_in_log"] = len(topics.read(run.bootstrap, output,
                                                  isolation="read_uncommitted"))
        return seen
    return look


def nemesis(o: Any) -> Nemesis:
    slow = lambda: on("before-commit", batch=SLOW_BATCH)  # noqa: E731 - one per part
    if not o.cut:
        return Nemesis(WaitUntil(
            slow(), ABORTED,
            starting="batch {batch}: processing takes longer than transaction.timeout.ms "
                     f"({TIMEOUT_MS} ms)",
            says="batch {batch}: the coordinator aborted its transaction (an ABORT marker in "
                 "the output); the app now calls commit_transaction"))
    return Nemesis(
        HoldRequests("EndTxn", slow(), until=ABORTED,
                     says="batch {batch}: its records are in the log; the app's commit (EndTxn) "
                          "is cut off on its way to the transaction coordinator",
                     released="the cut heals: the held commit reaches the coordinator"),
        Observe(slow(), readers_see("while_open", log=True),
                says="a read_committed reader sees {visible_while_open} records; the log holds "
                     "{open_in_log} (the open transaction's records wait for its marker)"),
        Observe(on("releasing", api="EndTxn"), readers_see("after_abort"),
                says=f"the coordinator aborted it after transaction.timeout.ms ({TIMEOUT_MS} "
                     "ms); a read_committed reader sees {visible_after_abort} records"))


def facts(run: Any) -> dict:
    """How long batch 2's transaction stayed open: until the coordinator aborted it, as the
    app waited (``slow_s``, from when the batch was written) and as the log shows it
    (``open_ms``: from the aborted records' CreateTime, stamped before the coordinator heard
    of the transaction, to the ABORT marker the coordinator had written)."""
    (fault,) = run.nemesis.of((WaitUntil, HoldRequests))
    slow = fault.waited_s if isinstance(fault, WaitUntil) else fault.held_s
    return {"slow_s": slow or 0.0, "open_ms": _open_ms(run.bootstrap, run.topics["output"])}


def _open_ms(bootstrap: str, topic: str) -> int | None:
    with Inspector(bootstrap) as inspector:
        offsets = inspector.offsets(topic)[0]
        batches = list(inspector.batches(topic, 0, offsets.log_start, offsets.high_watermark))
    abort = next((b for b in batches if b.is_control and b.marker == "ABORT"), None)
    if abort is None:
        return None
    # its transaction: the producer's batches since its previous marker (the marker's epoch
    # is the records' plus one under transaction version 2, so the producer id tells)
    mine = [b for b in batches if b.producer_id == abort.producer_id
            and b.base_offset < abort.base_offset]
    since = max((i for i, b in enumerate(mine) if b.is_control), default=-1)
    written = [b.max_timestamp for b in mine[since + 1:]]
    return abort.max_timestamp - max(written) if written else None


def as_json(run: Any) -> dict:
    cut = {} if not run.options["cut"] else {
        "visible_while_open": run.facts.get("visible_while_open", 0),
        "visible_after_abort": run.facts.get("visible_after_abort", 0),
        "open_in_log": run.facts.get("open_in_log")}
    return {**run.report.to_dict(), "errors": run.errors, "slow_s": round(run.slow_s, 1),
            "producers": run.producers, **cut}


register(Experiment(
    SCENARIO, "an exactly-once loop whose batch 2 outlasts transaction.timeout.ms",
    pipeline="the loop (as copy_fees)",
    text=lambda run: f"{run.report.summary()}\nerrors: {', '.join(run.errors)}\n{run.timeline()}",
    options=(common.records(30, minimum=BATCH * (SLOW_BATCH + 1),
                    why=f"batches of {BATCH}, batch {SLOW_BATCH} the slow one, one after it"),
             Option("cut", False, "instead of a slow batch, cut the app's commit off from "
                    "its transaction coordinator until the coordinator aborts", kind=bool)),
    workload=lambda o: Workload(SCENARIO, (Topic("input", loaded=True), Topic("output")),
                                data.generate(o.records, prefix="t")),
    clients=lambda run: FeeLoop(producer_settings={"transaction.timeout.ms": TIMEOUT_MS},
                                fatal_restarts=1),
    nemesis=nemesis,
    checkers=lambda o: [TopicAudit(SCENARIO, "exactly_once", fault=(
        f"batch {SLOW_BATCH}'s commit cut off from the coordinator" if o.cut else
        f"batch {SLOW_BATCH} slower than transaction.timeout.ms"))],
    facts=facts, presentation=Presentation(json=as_json)))
