"""When the transaction coordinator fails: an exactly-once loop still delivers each record once.

    with failure_lab() as lab:                        # labkit.experiments.failover: 3 brokers of its own
        run = coordinator_failover(lab)               # -> CoordinatorRun
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

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
from confluent_kafka import (Consumer, ElectionType, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import AdminClient

from labkit.checking import audit

from labkit.kafka import names, topics

from labkit.pipelines import data
from labkit.checking.audit import AuditReport
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import LocalCluster
from labkit.experiments.failover import BROKERS, wait_until
from labkit.faults.watchdog import Watchdog
from labkit.kafka.inspect import InspectError, Inspector, ReplicaState, UnknownTopicError
from labkit.pipelines.ctp import transform
from labkit.progress import status

BATCH = 10
KILL_MID_TRANSACTION, KILL_AFTER_END_TXN = 2, 4  # the batches (from 1) whose coordinator dies
SCENARIO = "coordinator-failover"
TRANSACTION_STATE = "__transaction_state"
# No progress (no batch sent or ended, no step) for this long stops the run with an error
# naming its last step: longer than the longest bounded wait of its fault schedule (90 s for
# the markers after the second kill), so only a wait without a bound trips it.
STALL_S = 120.0
CONSUMER_OFFSETS = "__consumer_offsets"


@dataclass
class CoordinatorRun:
    report: AuditReport
    coordinators: list[int]  # the coordinator's broker: at the start, after each kill
    errors: list[str]  # what commit_transaction raised, as the client classified it
    steps: list[tuple[float, str]] = field(default_factory=list, repr=False)

    def to_json(self) -> str:
        return json.dumps({**json.loads(self.report.to_json()),
                           "coordinators": self.coordinators, "errors": self.errors})

    def timeline(self) -> str:
        return "\n".join(f"{t:5.1f} s  {what}" for t, what in self.steps)


def copy_fees(consumer: Consumer, producer: Producer, output: str, records: int,
              before_commit: Callable[[int], None], after_end: Callable[[int, bool], None],
              errors: list[str]) -> None:
    """The exactly-once loop: each batch's fees and input offsets in one transaction.

    ``before_commit(batch)`` and ``after_end(batch, committed)`` (batches counted from 1,
    a batch read again counts anew) are where the lab's faults go.
    send_offsets_to_transaction's and commit_transaction's errors are handled as librdkafka
    classifies them: retriable, call it again (for 2 minutes at most); abortable
    (txn_requires_abort), abort and read the batch again from the committed offset; anything
    else (fatal, e.g. fenced) ends the app."""
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
                         loop: Callable[..., None] = copy_fees,
                         on_step: Callable[[str], None] | None = None,
                         stall_s: float = STALL_S) -> CoordinatorRun:
    """Kill the transaction coordinator mid-transaction, then between EndTxn and the markers.
    ``loop``: the app, called as ``copy_fees`` is (a learner's version of it, notebook 05b).
    ``on_step``: called with each line of the timeline as it happens (the CLI prints them).
    ``stall_s``: no batch sent or ended for this long kills the lab's brokers and raises
    ``ExperimentStalled`` naming the last step (``labkit.faults.watchdog``)."""
    check_records(records)
    watchdog = Watchdog(SCENARIO, stall_s)
    lab.restart()  # every broker up, whatever a previous run left
    base = names.topic(f"coordinator-{time.monotonic_ns() % 10**9}")
    source, output = f"{base}-in", f"{base}-out"
    start = time.monotonic()
    steps: list[tuple[float, str]] = []
    errors: list[str] = []
    # what the loop does next, for the watchdog's error (set by the hooks below)
    waiting = ["batch 1: consume, produce, send_offsets_to_transaction()"]

    def step(what: str) -> None:
        steps.append((round(time.monotonic() - start, 1), what))
        watchdog.progress(what, waiting[0])
        say(what)
        if on_step:
            on_step(f"{steps[-1][0]:5.1f} s  {what}")

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
            "isolation.level": "read_committed", "log_level": 2}))
        step(f"{records} inputs written; transaction coordinator: broker {first}; "
             f"the topics' leader: broker {leader}")
        consumer.subscribe([source])
        freeze = FreezeWindow(lab, leader)
        second_kill_done = False

        def before_commit(batch_no: int) -> None:
            waiting[0] = f"commit_transaction() of batch {batch_no}"
            watchdog.progress(f"batch {batch_no}: records and offsets sent", waiting[0])
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
            watchdog.progress(f"batch {batch_no}: {'committed' if committed else 'aborted'}",
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

        stalled = False

        def stop_brokers() -> None:
            nonlocal stalled
            stalled = True
            freeze.end()
            lab.kill()  # the next run (lab.restart) starts them again

        try:
            watchdog.run(lambda: loop(consumer, producer, names.topic(output), records,
                                      before_commit, after_end, errors),
                         on_stall=stop_brokers,
                         stopped="the failure lab's brokers were killed; the next run "
                                 "starts them again")
        finally:
            freeze.end()
            if not stalled:  # a stalled loop's thread still holds the consumer
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


def group_coordinated_by(lab: LocalCluster, broker: int, prefix: str) -> str:
    """A consumer group id starting with ``prefix`` whose coordinator is ``broker``: the
    leader of its ``__consumer_offsets`` partition (Kafka: abs(Java hashCode of the id) %
    partitions). The topic is created by the first FindCoordinator, asked here; each of its
    partitions is given back to its preferred leader (earlier runs' kills moved them all to
    the brokers that survived), so every broker leads some."""
    probe = Consumer(client_config({"bootstrap.servers": lab.bootstrap,
                                    "group.id": f"{prefix}-probe", "log_level": 2}))
    try:
        with contextlib.suppress(KafkaException):  # no committed offset: only the lookup matters
            probe.committed([TopicPartition(CONSUMER_OFFSETS, 0)], timeout=30)
    finally:
        probe.close()
    address = lab.broker(broker).address
    found: list[ReplicaState] = []

    def preferred() -> bool:
        try:
            with Inspector(address, timeout_s=5) as inspector:
                found[:] = inspector.replica_states(CONSUMER_OFFSETS, at=address)
        except (InspectError, UnknownTopicError, OSError):  # not created yet
            return False
        return bool(found) and all(p.leader == p.replicas[0] for p in found)

    if not preferred():
        admin = AdminClient(client_config({"bootstrap.servers": lab.bootstrap, "log_level": 2}))
        with contextlib.suppress(KafkaException):  # ELECTION_NOT_NEEDED and the like
            admin.elect_leaders(ElectionType.PREFERRED, [
                TopicPartition(CONSUMER_OFFSETS, p) for p in range(len(found) or 1)]).result(30)
        wait_until(preferred, "__consumer_offsets led by its preferred replicas", 60)
    for n in range(1000):
        group = f"{prefix}-{n}"
        if found[java_abs(java_hash(group)) % len(found)].leader == broker:
            return group
    raise RuntimeError(f"no __consumer_offsets partition is led by broker {broker}")


def check_records(records: int) -> None:
    """A ValueError that says what to use, before any broker is started."""
    if records < BATCH * (KILL_AFTER_END_TXN + 1):
        raise ValueError(f"records must be {BATCH * (KILL_AFTER_END_TXN + 1)} or more "
                         f"(batches of {BATCH}, the second kill at batch {KILL_AFTER_END_TXN})")


def next_coordinator(lab: LocalCluster, transactional_id: str, current: int) -> int:
    """The broker that will coordinate ``transactional_id`` once ``current`` dies: the
    controller elects the first in-sync replica, in replica order, of its partition."""
    _, state = transaction_state_partition(lab, transactional_id, ask=current)
    return next(r for r in state.replicas if r != current and r in state.isr)


def transaction_state_partition(lab: LocalCluster, transactional_id: str,
                                ask: int | None = None) -> tuple[int, ReplicaState]:
    """The ``__transaction_state`` partition that keeps ``transactional_id`` (Kafka: abs(Java
    hashCode of the id) % partitions) and its replicas; its leader is the coordinator.
    Returned once every replica is in sync again (a broker restarted moments ago catches
    up first): the controller elects from the ISR as it is when the leader dies.
    ``ask``: the broker to ask (default: the first one)."""
    address = lab.broker(ask or BROKERS[0]).address
    partition = java_abs(java_hash(names.transactional_id(transactional_id)))
    found: list[ReplicaState] = []

    def in_sync() -> bool:
        try:
            with Inspector(address, timeout_s=5) as inspector:
                states = inspector.replica_states(TRANSACTION_STATE, at=address)
        except OSError:  # that broker is still starting
            return False
        found[:] = [states[partition % len(states)]]
        return set(found[0].isr) == set(found[0].replicas)

    wait_until(in_sync, f"every replica of the partition of {transactional_id} in sync", 60)
    return found[0].partition, found[0]


def kill_coordinator(lab: LocalCluster, transactional_id: str) -> tuple[int, int]:
    """SIGKILL the broker coordinating ``transactional_id``; return it and the broker that
    coordinates the id next. The killed broker is started again before this returns."""
    lab.restart()
    producer = Producer(client_config({"bootstrap.servers": lab.bootstrap,
                                       "transactional.id": transactional_id,
                                       "log_level": 2}))  # quiet about the broker killed
    producer.init_transactions(60)  # the coordinator knows the id from here on
    transaction_state_partition(lab, transactional_id)  # the ISR whole again before the kill
    first = transaction_coordinator(lab, transactional_id)
    lab.kill(first)
    try:
        return first, transaction_coordinator(lab, transactional_id, not_on=first)
    finally:
        lab.restart(first)


def java_hash(text: str) -> int:
    """Java's String.hashCode (a signed 32-bit int) of an ASCII ``text``."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def java_abs(n: int) -> int:
    """Kafka's Utils.abs: Math.abs, with Integer.MIN_VALUE mapped to 0."""
    return 0 if n == -(1 << 31) else abs(n)


def transaction_coordinator(lab: LocalCluster, transactional_id: str,
                            not_on: int | None = None) -> int:
    """The broker coordinating ``transactional_id`` (FindCoordinator), once it is not
    ``not_on`` (a killed coordinator is replaced after the controller noticed)."""
    by_address = {b.address: b.node_id for b in lab.brokers}
    found: list[int] = []

    def located() -> bool:
        for b in lab.brokers:
            if b.node_id == not_on:
                continue
            try:
                with Inspector(b.address, timeout_s=5) as inspector:
                    address = inspector.transaction_coordinator(transactional_id)
            except OSError:
                continue
            if by_address.get(address) not in (None, not_on):
                found.append(by_address[address])
                return True
            return False
        return False

    wait_until(located, f"the coordinator of {transactional_id}", 30)
    return found[0]
