"""The errors a consume-transform-produce loop meets, each provoked on a real broker through
the fault proxy, one transaction at a time: which call raised, librdkafka's code for it, its
class as the client says it (``fatal()``, ``retriable()``, ``txn_requires_abort()``), and what
the production loop (``labkit.pipelines.production_loop``) does for that class.

    table = error_classes.provoke(lab.bootstrap)     # notebook 06, section 7

A transaction is the loop's: consume, ``begin_transaction``, ``produce``, ``flush``,
``send_offsets_to_transaction`` with the consumer's position and group metadata,
``commit_transaction``. The first call that raises is the row's; the loop's reaction follows
(abort and rewind, commit again, a new producer or consumer), so the next fault meets a loop
that is working again.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import pandas as pd
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from labkit import proc
from labkit.faults.proxy import FaultProxy
from labkit.kafka import names, topics
from labkit.kafka.clientlog import client_config, client_logger
from labkit.progress import status

# (the fault on the wire, in words; the fault as the proxy takes it; the commit's timeout)
FAULTS = (
    ("a record refused (Produce: INVALID_RECORD)", "error:produce:1:INVALID_RECORD"),
    ("offsets refused: not a member (TxnOffsetCommit: UNKNOWN_MEMBER_ID)",
     "error:txnoffsetcommit:1:UNKNOWN_MEMBER_ID"),
    ("offsets refused: an old generation (TxnOffsetCommit: ILLEGAL_GENERATION)",
     "error:txnoffsetcommit:1:ILLEGAL_GENERATION"),
    ("offsets refused: static member replaced (TxnOffsetCommit: FENCED_INSTANCE_ID)",
     "error:txnoffsetcommit:1:FENCED_INSTANCE_ID"),
    ("the commit's answer held 2.5 s, commit_transaction(1): outcome unknown",
     "delay:2500:endtxn"),
    ("a newer producer (EndTxn: PRODUCER_FENCED)", "error:endtxn:1:PRODUCER_FENCED"),
    ("an old epoch (Produce: INVALID_PRODUCER_EPOCH)", "error:produce:1:INVALID_PRODUCER_EPOCH"),
    ("static member replaced (Heartbeat: FENCED_INSTANCE_ID)",
     "error:heartbeat:1:FENCED_INSTANCE_ID"),
    ("KIP-848: a static member back before its old session ended "
     "(ConsumerGroupHeartbeat: UNRELEASED_INSTANCE_ID)",
     "error:consumergroupheartbeat:1:UNRELEASED_INSTANCE_ID"),
)
# the group protocol a fault needs (every other: the classic one)
PROTOCOL_OF = {"error:consumergroupheartbeat:1:UNRELEASED_INSTANCE_ID": "consumer"}
COMMIT_TIMEOUT_S = 1  # the held commit's: shorter than the hold, so the outcome is unknown
# The production loop's except, line by line: what it does for each class.
THE_LOOP_DOES = {
    "fatal": "raise: this instance ends; a new one (same ids) fences it and reads on",
    "retriable": "commit_transaction() again: the broker says how it ended",
    "abortable": "abort_transaction(), rewind, read the batch again",
}


def kind(error: KafkaError) -> str:
    """The class the client gives an error, in the order the loop asks: fatal, retriable,
    abortable (what is none of them is aborted, as abortable)."""
    return ("fatal" if error.fatal() or error.code() == KafkaError._FATAL
            else "retriable" if error.retriable() else "abortable")


def provoke(bootstrap: str, faults: tuple[tuple[str, str], ...] = FAULTS) -> pd.DataFrame:
    """Each fault of ``faults`` on one transaction of the loop, on ``bootstrap``: a row per
    fault, with the call that raised, the client's code and class, and the loop's reaction."""
    run = uuid.uuid4().hex[:8]
    source, sink = names.topic(f"errors-in-{run}"), names.topic(f"errors-out-{run}")
    topics.create(bootstrap, source, sink)
    try:
        _fill(bootstrap, source, 40 * len(faults))  # the heartbeat's row reads on for seconds
        with FaultProxy(bootstrap) as proxy, status("Each error, provoked") as say:
            return pd.DataFrame(_rows(proxy, source, sink, f"errors-{run}", faults, say))
    finally:
        topics.delete(bootstrap, source, sink)


def _fill(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer(client_config({"bootstrap.servers": bootstrap}))
    for n in range(count):
        producer.produce(topic, key=f"acct-{n % 3}", value=f'{{"id": "e-{n}"}}')
    producer.flush(30)


def _rows(proxy: FaultProxy, source: str, sink: str, group: str,
          faults: tuple[tuple[str, str], ...], say: Callable[[str], None]) -> list[dict]:
    loop = _Loop(proxy.bootstrap, source, sink, group, "classic")
    rows = []
    try:
        for what, fault in faults:
            say(f"Each error, provoked: {what}")
            protocol = PROTOCOL_OF.get(fault, "classic")
            if protocol != loop.protocol:  # the fault comes as the member joins
                loop.close()
                proxy.apply(fault)
                loop = _Loop(proxy.bootstrap, source, sink, group, protocol)
            else:
                proxy.apply(fault)
            call, error = loop.until_refused()
            if fault.startswith("delay:"):
                proxy.clear()  # the answer comes: the loop's second commit learns the outcome
            then = loop.react(error)
            if error is not None and error.code() == KafkaError._FATAL:
                call += f" (an event; fatal() {error.fatal()})"  # the code says it, not fatal()
            rows.append({"fault on the wire": what, "raised by": call,
                         "error": error.name() if error else "none",
                         "class": kind(error) if error else "",
                         "the loop": THE_LOOP_DOES[kind(error)] if error else "",
                         "then": then})
    finally:
        loop.close()
    return rows


class _Loop:
    """The production loop's client calls, one transaction at a time."""

    def __init__(self, bootstrap: str, source: str, sink: str, group: str, protocol: str):
        self.bootstrap, self.source, self.sink, self.group = bootstrap, source, sink, group
        self.protocol = protocol
        self.consumer, self.producer = self._consumer(), self._producer()

    def _consumer(self) -> Consumer:
        classic = {"session.timeout.ms": 10000,  # the production loop's
                   "heartbeat.interval.ms": 1000}  # the heartbeat's refusal within a second
        consumer = Consumer(client_config({
            "bootstrap.servers": self.bootstrap, "group.id": f"{self.group}-{self.protocol}",
            "group.protocol": self.protocol, "group.instance.id": f"{self.group}-0",
            **(classic if self.protocol == "classic" else {}),
            "isolation.level": "read_committed", "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0}))  # the table says what each call raised
        consumer.subscribe([self.source])
        return consumer

    def _producer(self) -> Producer:
        producer = Producer(client_config({"bootstrap.servers": self.bootstrap,
                                           "transactional.id": f"{self.group}-0",
                                           "log_level": 0}))
        producer.init_transactions(30)
        return producer

    def until_refused(self, within_s: float = 8.0) -> tuple[str, KafkaError | None]:
        """Transactions until one call raises (a heartbeat's refusal comes within its
        interval, 3 s): that call and its error, or ("", None) after ``within_s``."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            call, error = self.transaction()
            if error is not None:
                return call, error
        return "", None

    def transaction(self) -> tuple[str, KafkaError | None]:
        """The first call that raised and its error (None: the transaction committed)."""
        call = "consume()"  # a consumer's refusal comes as an error event
        try:
            batch = []
            for msg in self.consumer.consume(10, timeout=1.0):
                if msg.error() is None:
                    batch.append(msg)
                elif msg.error().code() == KafkaError._FATAL or msg.error().fatal():
                    raise KafkaException(msg.error())  # the consumer's fatal error
            if not batch:
                return call, None
            call = "begin_transaction()"
            self.producer.begin_transaction()
            call = "produce()"
            for msg in batch:
                self.producer.produce(self.sink, key=msg.key(), value=msg.value())
            call = "flush()"
            self.producer.flush(30)
            call = "send_offsets_to_transaction()"
            self.producer.send_offsets_to_transaction(
                self.consumer.position(self.consumer.assignment()),
                self.consumer.consumer_group_metadata(), 30)
            call = "commit_transaction()"
            self.producer.commit_transaction(COMMIT_TIMEOUT_S)
            return call, None
        except KafkaException as exc:
            return call, exc.args[0]

    def react(self, error: KafkaError | None) -> str:
        """What the production loop does for ``error``'s class, and what came of it."""
        if error is None:
            return ""
        if kind(error) == "fatal":  # a new instance: new clients, the same ids
            refused = error.code() == KafkaError._FATAL  # the group's refusal: it holds nothing
            self.close(settle_s=0 if refused else 20.0)
            self.consumer, self.producer = self._consumer(), self._producer()
            return "a new instance, initialised"
        if error.retriable():
            try:
                self.producer.commit_transaction(30)
                return "committed"
            except KafkaException as again:
                return f"again: {again.args[0].name()}"
        self.producer.abort_transaction(30)
        self._rewind()
        return "aborted, batch read again"

    def _rewind(self) -> None:
        for tp in self.consumer.committed(self.consumer.assignment(), timeout=30):
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))

    def close(self, settle_s: float = 20.0) -> None:
        _close(self.consumer, settle_s)


# A static member in a process of its own: it joins, says so once it holds partitions, and
# polls on until it is SIGKILLed (no leave: the group keeps its place until its session ends)
_MEMBER = """
import sys
from confluent_kafka import Consumer
from labkit.kafka.clientlog import client_config, client_logger
bootstrap, topic, group, protocol = sys.argv[1:5]
consumer = Consumer(client_config({"bootstrap.servers": bootstrap, "group.id": group,
    "group.protocol": protocol, "group.instance.id": "member-0",
    **({"session.timeout.ms": 10000} if protocol == "classic" else {})}))
consumer.subscribe([topic])
told = False
while True:
    consumer.poll(0.2)
    if consumer.assignment() and not told:
        print("assigned", flush=True)
        told = True
"""


def static_restart(bootstrap: str, protocol: str, within_s: float = 30.0) -> dict:
    """A static member (``group.instance.id``) SIGKILLed, then started again with the same
    id under ``protocol``, as a supervisor restarts it: what the group answers the new one
    (each refusal: a new consumer, as the loop's restart would make) and the seconds from the
    kill until it holds its partitions again."""
    run = uuid.uuid4().hex[:8]
    topic, group = names.topic(f"static-{run}"), f"static-{run}"
    topics.create(bootstrap, topic)
    member = proc.spawn([sys.executable, "-c", _MEMBER, bootstrap, topic, group, protocol],
                        stdout=subprocess.PIPE, text=True)
    log, level = client_logger(), client_logger().level
    try:
        if member.stdout.readline().strip() != "assigned":
            raise RuntimeError(f"the first member never got its partitions ({protocol})")
        member.kill()  # SIGKILL: it never leaves the group
        member.wait()
        log.setLevel(logging.CRITICAL + 1)  # a refusal a poll: the row says what it was
        return {"group protocol": protocol,
                **_rejoin(bootstrap, topic, group, protocol, time.monotonic(), within_s)}
    finally:
        log.setLevel(level)
        proc.stop([member], 5)
        topics.delete(bootstrap, topic)


def _rejoin(bootstrap: str, topic: str, group: str, protocol: str, killed: float,
            within_s: float) -> dict:
    refusals: list[str] = []
    while time.monotonic() - killed < within_s:
        consumer = Consumer(client_config({
            "bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
            "group.instance.id": "member-0", "log_level": 0,
            **({"session.timeout.ms": 10000} if protocol == "classic" else {})}))
        consumer.subscribe([topic])
        refused = _until_assigned_or_refused(consumer, killed + within_s)
        seconds = round(time.monotonic() - killed, 1)
        _close(consumer, settle_s=0 if refused else 20.0)
        if refused is None:
            return {"refused with": ", ".join(refusals) or "nothing",
                    "seconds until it had its partitions": seconds}
        if refused not in refusals:
            refusals.append(refused)
    raise RuntimeError(f"the restarted member got no partitions in {within_s:.0f} s")


def _close(consumer: Consumer, settle_s: float = 20.0) -> None:
    """``consumer`` closed with nothing left to revoke or assign. A rebalance handed to the
    application inside ``close()`` after its group has ended waits for good in librdkafka
    (its issue 4041), and confluent-kafka makes that call holding the GIL, so the whole kernel
    stopped (06 in fresh clones' suites, closing an instance whose join was still going; gdb
    showed both). So a join in progress is let finish, and the partitions are given back in a
    poll, while the group still answers. ``settle_s`` 0: a consumer the group refused (it
    holds nothing and never will)."""
    try:
        if _holds_partitions(consumer, settle_s):
            consumer.unsubscribe()
            deadline = time.monotonic() + 5.0
            while consumer.assignment() and time.monotonic() < deadline:
                consumer.poll(0.1)  # what it returns is read again by the next instance
    except (KafkaException, RuntimeError):  # a fenced consumer: nothing more to give back
        pass
    try:
        consumer.close()
    except KafkaException:
        pass


def _holds_partitions(consumer: Consumer, within_s: float) -> bool:
    """Polls until ``consumer`` holds partitions; False at a fatal refusal or after
    ``within_s``."""
    deadline = time.monotonic() + within_s
    while not consumer.assignment():
        if time.monotonic() >= deadline:
            return False
        msg = consumer.poll(0.1)
        if msg is not None and msg.error() is not None and kind(msg.error()) == "fatal":
            return False
    return True


def _until_assigned_or_refused(consumer: Consumer, deadline: float) -> str | None:
    """None once ``consumer`` holds partitions; its fatal refusal's reason otherwise."""
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is not None and \
                msg.error().code() == KafkaError._FATAL:
            return f"{msg.error().name()}: {msg.error().str().rsplit(': ', 1)[-1]}"
        if consumer.assignment():
            return None
    return "no partitions in time"
