"""When the transaction coordinator fails: an exactly-once loop still delivers each record once.

    with failure_lab() as lab:                        # labkit.experiments.failover: 3 brokers of its own
        run = experiments.run("coordinator-failover")  # on a failure lab of its own
        run = coordinator_failover(lab)               # on one you hold (-> CoordinatorRun)
        run.report.lost, run.report.duplicated        # 0, 0

The consume-transform-produce loop of notebook 05, in plain confluent-kafka (``copy_fees``),
reads an input partition and writes the fees of each batch of 10 in one transaction, with
its input offsets. Its transaction coordinator (the broker leading the
``__transaction_state`` partition of its transactional.id) is SIGKILLed twice:

1. **mid-transaction**: batch 2's records and offsets are sent, ``commit_transaction`` not
   yet called. The app calls it anyway: the client finds the new coordinator, which loaded
   the transaction from the replicated ``__transaction_state``.
2. **between EndTxn and the markers**: the leader of the data partitions is frozen
   (SIGSTOP) so no COMMIT marker can be written; ``commit_transaction`` for batch 4 returns
   (the coordinator logged its decision, PrepareCommit); then the coordinator is killed
   and the leader thawed. The next coordinator finds the decision and writes the markers.

The data partitions, and the consumer group's coordinator, are on a broker that is never
the transaction coordinator, so only the transaction coordinator fails. The audit (``labkit.checking.audit``) reads the output read_committed and
read_uncommitted: lost, duplicated, aborted records visible.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from labkit.checking import audit

from labkit.kafka import names, topics

from labkit.pipelines import data
from labkit.checking.audit import AuditReport
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import LocalCluster
from labkit.experiments.failover import BROKERS
from labkit.kafka.coordinators import (group_coordinated_by, next_coordinator,
                                       transaction_coordinator, transaction_state_partition)
from labkit.kafka.inspect import InspectError, Inspector
from labkit.pipelines.ctp import transform
from labkit import progress
from labkit.experiments.registry import FAILURE_LAB, Experiment, Option, RunBasics, register
from labkit.progress import status, wait_until

BATCH = 10
KILL_MID_TRANSACTION, KILL_AFTER_END_TXN = 2, 4  # the batches (from 1) whose coordinator dies
SCENARIO = "coordinator-failover"
# No progress (no batch sent or ended, no step) for this long stops the run with an error
# naming its last step: longer than the longest bounded wait of its fault schedule (90 s for
# the markers after the second kill), so only a wait without a bound trips it.
STALL_S = 120.0


@dataclass
class CoordinatorRun(RunBasics):
    report: AuditReport
    coordinators: list[int]  # the coordinator's broker: at the start, after each kill
    errors: list[str]  # what commit_transaction raised, as the client classified it
    steps: list[tuple[float, str]] = field(default_factory=list, repr=False)
    def to_json(self) -> str:
        return json.dumps({**json.loads(self.report.to_json()),
                           "coordinators": self.coordinators, "errors": self.errors,
                           "timeline": self.timeline().splitlines()})


def copy_fees(consumer: Consumer, producer: Producer, output: str, records: int,
              before_commit: Callable[[int], None], after_end: Callable[[int, bool], None],
              errors: list[str]) -> None:
    """The exactly-once loop: each batch's fees and input offsets in one transaction.

    ``before_commit(batch)`` and ``after_end(batch, committed)`` (batches counted from 1,
    a batch read again counts anew) are where the lab's faults go.
    send_offsets_to_transaction's and commit_transaction's errors are handled as librdkafka
    classifies them: abortable (txn_requires_abort), abort and read the batch again from the
    committed offset; anything else (fatal, e.g. fenced) ends the app. Only
    commit_transaction's retriable errors are retried (``commit``, for 2 minutes at most): a
    retriable error of send_offsets_to_transaction ends the app like a fatal one."""
    batch_no, done = 0, 0
    while done < records:
        batch = [m for m in consumer.consume(BATCH, timeout=1.0) if m.error() is None]
        if not batch:
            continue
        batch_no += 1
        producer.begin_transaction()
        for msg in batch:
            fee = transform(topics.decode(msg.value()))
            producer.produce(output, key=msg.key(), value=topics.encode(fee))
        try:
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 60)
            before_commit(batch_no)
            commit(producer, errors)
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise
            producer.abort_transaction(60)
            rewind(consumer)
            after_end(batch_no, False)
            continue
        done = batch[-1].offset() + 1
        after_end(batch_no, True)


COMMIT_RETRY_S = 120  # retriable errors of commit_transaction: called again this long, then raised


def commit(producer: Producer, errors: list[str]) -> None:
    """commit_transaction, called again while the client says the error is retriable
    (for COMMIT_RETRY_S: then the retriable error is raised)."""
    deadline = time.monotonic() + COMMIT_RETRY_S
    while True:
        try:
            producer.commit_transaction(60)
            return
        except KafkaException as exc:
            err = exc.args[0]
            errors.append(classified(err))
            if not err.retriable() or time.monotonic() > deadline:
                raise


# What an exactly-once app does with a transactional call's error, by the error's class.
WHAT_THE_APP_DOES = {
    "retriable": "call the same method again",
    "abortable": "abort_transaction(), back to the committed offsets, process the batch again",
    "fatal": "close this producer, start a new one with the same transactional.id, "
             "back to the committed offsets, process the batch again",
}


def classified(err: KafkaError) -> str:
    """An error as the app sees it: its name and librdkafka's class for it, e.g.
    "_FENCED (fatal)": retriable (call again), abortable (abort the transaction), fatal."""
    kind = ("retriable" if err.retriable() else "abortable" if err.txn_requires_abort()
            else "fatal")
    return f"{err.name()} ({kind})"


def errors_by_class(seen: list[tuple[str, str]]) -> pd.DataFrame:
    """A table of errors met: one row per (where, the error as ``classified`` wrote it),
    with its class and what the app does for it."""
    rows = []
    for where, error in seen:
        name, _, kind = error.partition(" (")
        kind = kind.rstrip(")")
        if kind not in WHAT_THE_APP_DOES:
            raise ValueError(f"{error!r} is not an error as classified() writes it, "
                             "e.g. '_FENCED (fatal)'")
        rows.append({"where": where, "error": name, "class": kind,
                     "what the app does": WHAT_THE_APP_DOES[kind]})
    return pd.DataFrame(rows)


def rewind(consumer: Consumer) -> None:
    """Back to the committed offsets: the aborted batch is read again."""
    for tp in consumer.committed(list(consumer.assignment()), timeout=30):
        consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))


def coordinator_failover(lab: LocalCluster, records: int = 60,
                         loop: Callable[..., None] = copy_fees) -> CoordinatorRun:
    """Kill the transaction coordinator mid-transaction, then between EndTxn and the markers.
    ``loop``: the app, called as ``copy_fees`` is (a learner's version of it, notebook 05b).
    Each step goes to ``labkit.progress.step``: the watchdog that ``experiments.run`` puts
    around it counts them, and the CLI prints them as they happen."""
    check_records(records)
    lab.restart()  # every broker up, whatever a previous run left
    base = names.topic(f"coordinator-{time.monotonic_ns() % 10**9}")
    source, output = f"{base}-in", f"{base}-out"
    start = time.monotonic()
    steps: list[tuple[float, str]] = []
    errors: list[str] = []
    # what the loop does next, for the watchdog's error (set by the hooks below)
    waiting = ["batch 1: consume, produce, send_offsets_to_transaction()"]

    def step(what: str) -> None:
        progress.check()  # stopped by its watchdog: no broker is restarted after that
        steps.append((round(time.monotonic() - start, 1), what))
        progress.step(what, waiting[0])
        say(what)

    producer = Producer(client_config({
        "bootstrap.servers": lab.bootstrap, "transactional.id": base,
        # Its only log lines here are refused connections to the brokers this run kills;
        # what matters comes back as exceptions from the transaction calls.
        "log_level": 2}))
    inputs = data.generate(records, prefix="c")
    with status("Coordinator failover") as say:
        producer.init_transactions(60)  # the coordinator exists from here on
        first = transaction_coordinator(lab, base)
        coordinators = [first]
        # the data partitions' leader: neither this coordinator nor the next one, so the
        # second kill can freeze it without freezing the coordinator
        leader = next(b for b in BROKERS if b not in (first, next_coordinator(lab, base, first)))
        assignment = [[leader, *(b for b in BROKERS if b != leader)]]
        topics.create(lab.bootstrap, source, output, replica_assignment=assignment)
        data.load_into_topic(lab.bootstrap, source, inputs)
        # The consumer group's coordinator on that broker too: only the transaction
        # coordinator fails here. (With the group's coordinator killed and restarted as well,
        # send_offsets_to_transaction was seen to wait for minutes under load.)
        consumer = Consumer(client_config({
            "bootstrap.servers": lab.bootstrap, "group.id": group_coordinated_by(lab, leader, base),
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "isolation.level": "read_committed", "log_level": 2,
            "enable.partition.eof": True}))  # a loop may stop at its partitions' ends
        step(f"{records} inputs written; transaction coordinator: broker {first}; "
             f"the topics' leader: broker {leader}")
        consumer.subscribe([source])
        freeze = FreezeWindow(lab, leader)
        second_kill_done = False

        def before_commit(batch_no: int) -> None:
            waiting[0] = f"commit_transaction() of batch {batch_no}"
            progress.step(f"batch {batch_no}: records and offsets sent", waiting[0])
            if batch_no == KILL_MID_TRANSACTION:
                lab.kill(coordinators[-1])
                step(f"batch {batch_no}: records and offsets sent; coordinator "
                     f"(broker {coordinators[-1]}) SIGKILLed before commit_transaction")
            elif batch_no >= KILL_AFTER_END_TXN and not second_kill_done \
                    and coordinators[-1] != leader:
                producer.flush(30)  # the batch's records are on the leader before it freezes
                # Every replica of the id's partition in sync first, as its coordinator sees
                # it: freezing the leader takes one replica out of that ISR, and below
                # min.isr 2 the coordinator cannot log its decision until the thaw.
                transaction_state_partition(lab, base, ask=coordinators[-1])
                freeze.start()
                step(f"batch {batch_no}: topics' leader (broker {leader}) frozen: "
                     "no marker can be written")

        def after_end(batch_no: int, committed: bool) -> None:
            nonlocal second_kill_done
            waiting[0] = (f"batch {batch_no + 1}: consume, produce, "
                          "send_offsets_to_transaction()")
            progress.step(f"batch {batch_no}: {'committed' if committed else 'aborted'}",
                          waiting[0])
            if batch_no == KILL_MID_TRANSACTION:
                killed = coordinators[-1]
                coordinators.append(transaction_coordinator(lab, base, not_on=killed))
                outcome = "committed" if committed else "aborted, to be read again"
                step(f"batch {batch_no}: {outcome} through the new coordinator, broker "
                     f"{coordinators[-1]}; broker {killed} restarted")
                lab.restart(killed)  # three brokers again before the second kill
            elif batch_no >= KILL_AFTER_END_TXN and not second_kill_done:
                expired = freeze.stop_timer()
                if expired or not committed:
                    freeze.end()
                    outcome = "committed" if committed else "aborted"
                    if expired:
                        outcome += (f" only after the freeze ended ({FREEZE_LIMIT_S} s): its "
                                    "coordinator needed the frozen broker in its ISR")
                    step(f"batch {batch_no}: {outcome}; the kill waits for the next batch")
                    return
                second_kill_done = True
                killed = coordinators[-1]
                lab.kill(killed)
                pending = "before it could write the markers" if freeze.active else \
                    "(the topics' leader was the coordinator: not frozen, markers maybe written)"
                step(f"batch {batch_no}: commit_transaction returned; coordinator (broker "
                     f"{killed}) SIGKILLed {pending}")
                freeze.end()
                coordinators.append(transaction_coordinator(lab, base, not_on=killed))
                step(f"the new coordinator, broker {coordinators[-1]}, completes the commit")
                wait_until(lambda: markers_written(lab.bootstrap, output),
                           f"the COMMIT markers of batch {batch_no}", 90)
                step(f"batch {batch_no}: its COMMIT marker is in the output (LSO = high watermark)")
            else:
                step(f"batch {batch_no}: {'committed' if committed else 'aborted'}")

        try:
            loop(consumer, producer, names.topic(output), records, before_commit, after_end,
                 errors)
        finally:
            freeze.end()
            consumer.close()
        step("every input batch committed")
        lab.restart(wait=True)  # back to three brokers for the next run
        report = audit.audit_topic(lab.broker(leader).address, output, inputs, SCENARIO,
                                   "exactly_once", fault="coordinator SIGKILLed twice")
    topics.delete(lab.broker(leader).address, source, output)
    return CoordinatorRun(report, coordinators, errors, steps)


FREEZE_LIMIT_S = 20  # a commit needs ~5 s with the leader frozen (4 s to leave the ISR)


class FreezeWindow:
    """The topics' leader frozen until ``end()``, or thawed by a timer after FREEZE_LIMIT_S.

    The timer breaks the one deadlock this fault can make: if the id's partition has only
    the frozen broker and its leader in sync (a replica restarted moments ago fell behind
    again), the coordinator cannot log its decision, and the commit would wait for a thaw
    that comes only after it."""

    def __init__(self, lab: LocalCluster, broker: int):
        self.lab, self.broker = lab, broker
        self.active = False  # frozen now
        self.expired = False  # the timer thawed it
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        with self._lock:
            self.lab.freeze(self.broker)
            self.active, self.expired = True, False
            self._timer = threading.Timer(FREEZE_LIMIT_S, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def stop_timer(self) -> bool:
        """Stop the timer; True if it had already thawed the broker (the window is over)."""
        with self._lock:
            if self._timer:
                self._timer.cancel()
                self._timer = None
            return self.expired

    def end(self) -> None:
        self.stop_timer()
        self._thaw()

    def _expire(self) -> None:
        with self._lock:
            self.expired = self.active
        self._thaw()

    def _thaw(self) -> None:
        with self._lock:
            if self.active:
                self.active = False
                self.lab.thaw(self.broker)


def markers_written(bootstrap: str, topic: str) -> bool:
    """Whether every partition of ``topic`` has its last stable offset at its high
    watermark (no transaction waits for a marker there)."""
    try:
        with Inspector(bootstrap, timeout_s=5) as inspector:
            return all(o.lso == o.high_watermark for o in inspector.offsets(topic).values())
    except (InspectError, OSError):  # the partition's leader moved and is settling in
        return False


def check_records(records: int) -> None:
    """A ValueError that says what to use, before any broker is started."""
    if records < BATCH * (KILL_AFTER_END_TXN + 1):
        raise ValueError(f"records must be {BATCH * (KILL_AFTER_END_TXN + 1)} or more "
                         f"(batches of {BATCH}, the second kill at batch {KILL_AFTER_END_TXN})")


def _run(context, *, records: int) -> CoordinatorRun:
    return coordinator_failover(context.cluster, records, loop=context.pipeline or copy_fees)


register(Experiment(
    SCENARIO, "the transaction coordinator SIGKILLed twice under an exactly-once loop",
    _run, where=FAILURE_LAB, stall_s=STALL_S, pipeline="the loop (as copy_fees)",
    check=lambda records: check_records(records), text=lambda run: run.report.summary(),
    options=(Option("records", 60, "how many input records (50 or more)", kind=int,
                    short="-n"),)))
