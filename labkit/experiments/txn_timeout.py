"""A batch slower than transaction.timeout.ms: the coordinator aborts its transaction, and
the app learns it only at its next write or commit, as an error it cannot recover from.

    run = txn_timeout(lab.bootstrap)            # -> TimeoutRun
    run.errors                                  # ['_FENCED (fatal)'], as librdkafka reports it
    run.report.lost, run.report.duplicated      # 0, 0 (read_committed)
    run.report.aborted_in_log                   # 10: the slow batch, aborted by the coordinator

The app is notebook 05b's loop (``coordinator_failover.copy_fees``): commit errors handled
as the client classifies them. Its transaction coordinator aborts any transaction open longer
than the producer's ``transaction.timeout.ms`` and bumps the producer's epoch, so to
librdkafka the producer is fenced, as by a newer instance (the error says so): fatal. The app
does what a fatal error asks: a new producer with the same transactional.id, the consumer
back at its committed offsets, the batch processed again. The slow processing is the lab's
fault: batch 2 waits until the coordinator's ABORT marker is in the output (its last stable
offset back at the high watermark), so the run lasts as long as the broker takes, no more.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, Producer

from labkit.checking import audit
from labkit.faults.proxy import FaultProxy

from labkit.kafka import names, topics

from labkit.pipelines import data
from labkit.checking.audit import AuditReport
from labkit.kafka.clientlog import client_config
from labkit.experiments.coordinator_failover import BATCH, classified, copy_fees, markers_written, rewind
from labkit import progress
from labkit.experiments.registry import Experiment, Option, RunBasics, register
from labkit.progress import status, wait_until

SCENARIO = "txn-timeout"
TIMEOUT_MS = 3000  # the producer's transaction.timeout.ms: short, so the lesson waits seconds
SLOW_BATCH = 2  # the batch (from 1) whose processing outlasts it
# The coordinator looks for expired transactions every
# transaction.abort.timed.out.transaction.cleanup.interval.ms (Kafka's default 10 s; the
# lab's broker 1 s): the slow batch waits up to this long for the abort.
ABORT_WAIT_S = 60


@dataclass
class TimeoutRun(RunBasics):
    report: AuditReport
    errors: list[str]  # what the app's calls raised, as the client classified them
    slow_s: float  # how long the slow batch's processing took: until the coordinator aborted
    producers: int  # producer instances the app used (a fatal error ends one)
    steps: list[tuple[float, str]] = field(default_factory=list, repr=False)
    # cut=True: what a read_committed reader of the output saw while the commit was cut off
    # (its transaction open), then once the coordinator had aborted it: record ids per batch
    seen_while_open: list[str] | None = None
    seen_after_abort: list[str] | None = None
    open_in_log: int | None = None  # the open transaction's records, read uncommitted

    def to_json(self) -> str:
        return json.dumps({**json.loads(self.report.to_json()), "errors": self.errors,
                           "slow_s": round(self.slow_s, 1), "producers": self.producers,
                           **({} if self.seen_while_open is None else {
                               "visible_while_open": len(self.seen_while_open),
                               "visible_after_abort": len(self.seen_after_abort or []),
                               "open_in_log": self.open_in_log})})


def check_records(records: int) -> None:
    """A ValueError that says what to use, before anything is written."""
    if records < BATCH * (SLOW_BATCH + 1):
        raise ValueError(f"records must be {BATCH * (SLOW_BATCH + 1)} or more (batches of "
                         f"{BATCH}, batch {SLOW_BATCH} the slow one, one after it)")


def txn_timeout(bootstrap: str, records: int = 30, loop: Callable[..., None] = copy_fees,
                timeout_ms: int = TIMEOUT_MS, cut: bool = False) -> TimeoutRun:
    """Run the exactly-once loop over ``records`` inputs with batch 2 slower than
    ``timeout_ms``; restart its producer after the fatal error; audit the output.

    ``cut=True``: batch 2 is not slow; its commit is cut off instead. The producer talks to
    the broker through the lab's fault proxy, which holds its EndTxn (and everything behind
    it on that connection) until the coordinator has aborted the transaction for its
    timeout, then lets it through: a client partitioned from its transaction coordinator
    between produce and commit. A read_committed reader is asked what it sees meanwhile."""
    check_records(records)
    base = names.topic(f"txn-timeout-{time.monotonic_ns() % 10**9}")
    source, output = f"{base}-in", f"{base}-out"
    inputs = data.generate(records, prefix="t")
    data.load_into_topic(bootstrap, source, inputs)
    topics.create(bootstrap, output)
    start = time.monotonic()
    steps: list[tuple[float, str]] = []
    errors: list[str] = []
    slow: list[float] = []

    def step(what: str) -> None:
        steps.append((round(time.monotonic() - start, 1), what))
        progress.step(what)
        say(what)

    # batches counted over the whole run (the loop counts from 1 again with a new producer)
    counted = {"before": 0, "last": 0}

    def before_commit(loop_batch: int) -> None:
        batch_no = counted["last"] = counted["before"] + loop_batch
        if batch_no == SLOW_BATCH and not slow and cut:
            producer.flush(30)
            proxy.hold("EndTxn")
            cutter.start()  # the app goes on to commit_transaction(), which hangs
            return
        if batch_no == SLOW_BATCH and not slow:
            producer.flush(30)  # its records are in the log, its transaction open
            began = time.monotonic()
            step(f"batch {batch_no}: processing takes longer than transaction.timeout.ms "
                 f"({timeout_ms} ms)")
            wait_until(lambda: markers_written(bootstrap, output),
                       "the coordinator to abort the slow batch's transaction", ABORT_WAIT_S)
            slow.append(time.monotonic() - began)
            step(f"batch {batch_no}: the coordinator aborted its transaction (an ABORT marker "
                 "in the output); the app now calls commit_transaction")

    def after_end(loop_batch: int, committed: bool) -> None:
        batch_no = counted["before"] + loop_batch
        step(f"batch {batch_no}: {'committed' if committed else 'aborted, to be read again'}")

    views: dict[str, object] = {}

    def cut_until_aborted() -> None:
        """While the app's commit is held: what readers see, the abort, then the heal."""
        began = time.monotonic()
        step(f"batch {SLOW_BATCH}: its records are in the log; the app's commit "
             "(EndTxn) is cut off on its way to the transaction coordinator")
        views["open"] = [r.value["id"] for r in topics.read(bootstrap, output)]
        views["in_log"] = len(topics.read(bootstrap, output, isolation="read_uncommitted"))
        step(f"a read_committed reader sees {len(views['open'])} records; the log holds "
             f"{views['in_log']} (the open transaction's records wait for its marker)")
        try:
            wait_until(lambda: markers_written(bootstrap, output),
                       "the coordinator to abort the cut-off transaction", ABORT_WAIT_S)
            slow.append(time.monotonic() - began)
            views["aborted"] = [r.value["id"] for r in topics.read(bootstrap, output)]
            step(f"the coordinator aborted it after transaction.timeout.ms ({timeout_ms} ms); "
                 f"a read_committed reader sees {len(views['aborted'])} records")
        finally:
            proxy.release_held()  # the cut heals: the held commit reaches the coordinator
            step("the cut heals: the held commit reaches the coordinator")

    def cut_thread() -> None:
        try:
            cut_until_aborted()
        except BaseException as exc:  # raised in the app's thread once the run ends
            views["error"] = exc

    cutter = threading.Thread(target=cut_thread, name="txn-cut", daemon=True)
    proxy: FaultProxy | None = None
    consumer = Consumer(client_config({
        "bootstrap.servers": bootstrap, "group.id": base, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "isolation.level": "read_committed",
        "enable.partition.eof": True}))  # a loop may stop at its partitions' ends
    consumer.subscribe([source])
    producers = 0
    try:
        if cut:
            proxy = FaultProxy(bootstrap).start()
        with status("A commit cut off from its coordinator" if cut else
                    "A batch slower than transaction.timeout.ms") as say:
            while True:
                producer = Producer(client_config({
                    "bootstrap.servers": proxy.bootstrap if proxy else bootstrap,
                    "transactional.id": base,
                    "transaction.timeout.ms": timeout_ms}))
                producer.init_transactions(60)  # a new epoch: the app's previous producer is fenced
                producers += 1
                try:
                    loop(consumer, producer, names.topic(output), records, before_commit,
                         after_end, errors)
                    break
                except KafkaException as exc:
                    err = exc.args[0]
                    if not err.fatal() or producers > 1:
                        raise
                    if not errors or errors[-1] != classified(err):
                        errors.append(classified(err))  # raised outside commit
                    step(f"{classified(err)}: a new producer with the same transactional.id, "
                         "the consumer back at its committed offsets")
                    rewind(consumer)
                    counted["before"] = counted["last"]
            step("every input batch committed")
    finally:
        consumer.close()
        if proxy is not None:
            proxy.release_held()
            if cutter.is_alive():
                cutter.join(ABORT_WAIT_S)
            proxy.stop()
    if "error" in views:
        raise views["error"]  # type: ignore[misc]
    fault = (f"batch {SLOW_BATCH}'s commit cut off from the coordinator" if cut else
             f"batch {SLOW_BATCH} slower than transaction.timeout.ms")
    report = audit.audit_topic(bootstrap, output, inputs, SCENARIO, "exactly_once", fault=fault)
    topics.delete(bootstrap, source, output)
    return TimeoutRun(report, errors, slow[0] if slow else 0.0, producers, steps,
                      views.get("open"), views.get("aborted"), views.get("in_log"))


def _run(context, *, records: int, cut: bool) -> TimeoutRun:
    return txn_timeout(context.bootstrap, records, loop=context.pipeline or copy_fees, cut=cut)


register(Experiment(
    "txn-timeout", "an exactly-once loop whose batch 2 outlasts transaction.timeout.ms",
    _run, pipeline="the loop (as copy_fees)", check=lambda records, cut: check_records(records),
    text=lambda run: f"{run.report.summary()}\nerrors: {', '.join(run.errors)}\n{run.timeline()}",
    options=(Option("records", 30, "how many input records (30 or more)", kind=int,
                    short="-n"),
             Option("cut", False, "instead of a slow batch, cut the app's commit off from "
                    "its transaction coordinator until the coordinator aborts", kind=bool))))
