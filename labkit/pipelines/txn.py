"""A transactional producer whose errors say what to do.

librdkafka refuses a misused transactional API with terse errors ("Local: Erroneous
state"); this thin wrapper lets the real client refuse, then re-raises with the rule that
was broken. It adds no state of its own: Kafka's client decides what is allowed.

    txn = guarantee.transactions(bootstrap, "ctp-1")   # init_transactions() done
    txn.begin()
    txn.produce("out", key, value)
    txn.send_offsets(consumer, offsets)
    txn.commit()
"""
from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from labkit.kafka import names
from labkit.kafka.clientlog import client_config
from labkit.pipelines.common import GROUP_FENCING_ERRORS, DeliveryTracker, StaleGeneration

ORDER = ("init_transactions() once, then for each batch: begin_transaction(), produce(...), "
         "send_offsets_to_transaction(...), commit_transaction() (or abort_transaction())")

_HINTS = {
    "produce": "a transactional producer only produces inside a transaction: call "
               "begin_transaction() first",
    "begin_transaction": "a transaction is already open: commit_transaction() or "
                         "abort_transaction() it before the next begin_transaction()",
    "send_offsets_to_transaction": "offsets can only be sent inside an open transaction: "
                                   "call begin_transaction() first",
    "commit_transaction": "there is no open transaction to commit: call begin_transaction() first",
    "abort_transaction": "there is no open transaction to abort: call begin_transaction() first",
    "init_transactions": "init_transactions() is called once per producer, before anything else",
}


class TransactionMisuse(RuntimeError):
    """The transactional API was called in the wrong order; the message says the right one."""


class ProducerFenced(RuntimeError):
    """A newer producer with the same transactional.id took over: this one is a zombie."""


def explain(op: str, exc: KafkaException, transactional_id: str | None = None) -> Exception:
    """The labkit error for a librdkafka transaction error (or the original one)."""
    err: KafkaError = exc.args[0]
    if err.code() == KafkaError._STATE:
        hint = _HINTS.get(op, "")
        if "state Init" in err.str():  # librdkafka names its state; Init = never initialised
            hint = "call init_transactions() once, before any other transactional call"
        return TransactionMisuse(f"{op}() refused by the Kafka client ({err.str()}): {hint}. "
                                 f"The order is: {ORDER}.")
    if err.code() in GROUP_FENCING_ERRORS:
        return StaleGeneration(f"{op}() refused by the group coordinator: {err.name()} "
                               f"({err.str()}). This instance read these records in a group "
                               "generation that has ended: a rebalance gave the partitions to "
                               "another member, so this transaction must abort (KIP-447).")
    if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                      KafkaError.INVALID_PRODUCER_EPOCH):
        return ProducerFenced(f"{op}() failed: producer fenced ({err.str()}). Another instance "
                              f"with transactional.id {transactional_id!r} called "
                              "init_transactions() after this one; this instance must stop.")
    return exc


class Transactions:
    """A real transactional confluent-kafka Producer, with explained errors."""

    def __init__(self, bootstrap: str, transactional_id: str, *, config: dict,
                 init: bool = True, timeout_s: float = 60.0):
        """``config``: the full producer configuration (``guarantee.transactions`` gives the
        exactly_once guarantee's)."""
        self.transactional_id = names.transactional_id(transactional_id)  # as client_config makes it
        self.producer = Producer(client_config(config))
        self.delivery = DeliveryTracker(self.producer, strict=True)
        if init:
            self.init(timeout_s)

    def _call(self, op: str, fn, *args):
        try:
            return fn(*args)
        except KafkaException as exc:
            raise explain(op, exc, self.transactional_id) from exc

    def init(self, timeout_s: float = 60.0) -> None:
        self._call("init_transactions", self.producer.init_transactions, timeout_s)

    def begin(self) -> None:
        self._call("begin_transaction", self.producer.begin_transaction)

    def produce(self, topic: str, key: str | None, value: object) -> None:
        self._call("produce", self.delivery.produce, topic, key, value)

    def flush(self, timeout_s: float = 60.0) -> None:
        self.delivery.flush(timeout_s)

    def send_offsets(self, consumer: Consumer, offsets: list[TopicPartition],
                     group_metadata: object | None = None, timeout_s: float = 60.0) -> None:
        """Add ``offsets`` to the transaction, checked against ``group_metadata`` (default:
        the consumer's current group generation and member id)."""
        if group_metadata is None:
            group_metadata = consumer.consumer_group_metadata()
        self._call("send_offsets_to_transaction", self.producer.send_offsets_to_transaction,
                   offsets, group_metadata, timeout_s)

    def commit(self, timeout_s: float = 60.0) -> None:
        self._call("commit_transaction", self.producer.commit_transaction, timeout_s)

    def abort(self, timeout_s: float = 60.0) -> None:
        self._call("abort_transaction", self.producer.abort_transaction, timeout_s)

    def abort_after_error(self) -> None:
        """Abort the open transaction after a failed step; a fenced producer cannot abort
        (its successor already did), so that refusal is not an error here."""
        try:
            self.abort()
        except (ProducerFenced, TransactionMisuse):
            pass
