"""The three processing guarantees, one class each (Kafka Streams' ``processing.guarantee``).

A guarantee is four decisions, and each class below makes them in one place:

1. the producer settings (acks, retries, idempotence, a transactional.id),
2. how the input is read (isolation level) and where a restarted worker resumes,
3. in which order a batch's work and its input position are made durable,
4. what a worker does when the group takes partitions away (revocation).

Every pipeline, scenario, exercise and the cost benchmark takes its settings from here:

    g = guarantee("exactly_once")
    out = g.open_output(bootstrap, transactional_id="app-0")
    g.run_batch(out, work=lambda: ..., save_position=lambda: g.commit_offsets(out, consumer, offsets))
"""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from confluent_kafka import Consumer, Producer, TopicPartition

from labkit.kafka.clientlog import COORDINATOR_STALL_WORKAROUND_MS, client_config
from labkit.faults.crashpoints import crash_point
from labkit.pipelines.common import DeliveryTracker, commit
from labkit.pipelines.txn import Transactions

MAX_RETRIES = 2_147_483_647


class Guarantee:
    """What all three share; the subclasses differ only where the guarantee does."""

    name: ClassVar[str]
    # How the input (and a state store's changelog) is read.
    isolation: ClassVar[str] = "read_uncommitted"
    transactional: ClassVar[bool] = False
    # Does a failed delivery stop the pipeline? Not for fire and forget: it never knows.
    delivery_errors_fail: ClassVar[bool] = True

    def __init__(self, idempotent: bool = False):
        # The idempotent producer (acks=all, retries, sequence numbers): it removes the
        # duplicates a retried produce request would write, not those of reprocessing.
        self.idempotent = idempotent

    def producer_settings(self, transactional_id: str | None = None) -> dict:
        raise NotImplementedError

    def consumer_settings(self) -> dict:
        # Offsets are committed by the guarantee's own order below, never in the background.
        return {"isolation.level": self.isolation, "enable.auto.commit": False}

    def open_output(self, bootstrap: str, transactional_id: str | None = None,
                    tuning: dict | None = None):
        """The producer a pipeline writes with (a DeliveryTracker or, exactly_once, Transactions)."""
        conf = {"bootstrap.servers": bootstrap, **(tuning or {}), **self.producer_settings()}
        return DeliveryTracker(Producer(client_config(conf)), strict=self.delivery_errors_fail,
                               acknowledged=conf.get("acks") != 0)

    def commit_offsets(self, out, consumer: Consumer, offsets: list[TopicPartition],
                       group_metadata: object | None = None) -> None:
        """Make the input position durable: the group's committed offsets."""
        commit(consumer, offsets)

    def run_batch(self, out, work: Callable[[], None], save_position: Callable[[], None]) -> None:
        raise NotImplementedError

    def on_revoke(self, pending: list, revoked: set[tuple[str, int]]) -> list:
        """Partitions taken away by a rebalance: keep only polled records we still own.

        Rebalance callbacks run inside poll(), and a batch is committed (or aborted) before
        the next poll: at revocation nothing is processed-but-uncommitted and no transaction
        is open. What remains is records polled but not processed yet; the new owner reads
        them again from the committed offsets, so they are dropped here, unprocessed.
        """
        return [m for m in pending if (m.topic(), m.partition()) not in revoked]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(idempotent={self.idempotent})"


class AtMostOnce(Guarantee):
    """Fire and forget; the position is saved *before* the work: a crash skips, never repeats.

    With ``idempotent=True`` the producer waits for acks and retries (idempotence needs
    both), but the position is still saved first: a crash still skips the batch.
    """

    name = "at_most_once"
    delivery_errors_fail = False

    def producer_settings(self, transactional_id: str | None = None) -> dict:
        if self.idempotent:
            return {"acks": "all", "retries": MAX_RETRIES, "enable.idempotence": True}
        return {"acks": 0, "retries": 0, "enable.idempotence": False}

    def run_batch(self, out, work, save_position) -> None:
        save_position()
        crash_point("after-commit-before-process")
        work()


class AtLeastOnce(Guarantee):
    """Acks and retries; the position is saved *after* the work: a crash repeats, never skips."""

    name = "at_least_once"

    def producer_settings(self, transactional_id: str | None = None) -> dict:
        return {"acks": "all", "retries": MAX_RETRIES, "enable.idempotence": self.idempotent,
                "max.in.flight.requests.per.connection": 5}

    def run_batch(self, out, work, save_position) -> None:
        work()
        crash_point("after-process-before-commit")
        save_position()
        crash_point("after-commit")


class ExactlyOnce(Guarantee):
    """The work and the input position commit together, in one transaction, or not at all.

    Input is read with read_committed, so neither aborted output upstream nor offsets of an
    unfinished transaction are ever seen. The offsets go to the transaction with the consumer
    group's metadata (generation, member id): after a rebalance the broker refuses a zombie's
    commit for partitions it no longer owns (KIP-447).
    """

    name = "exactly_once"
    isolation = "read_committed"
    transactional = True
    TRANSACTION_TIMEOUT_MS = 60_000

    def __init__(self, idempotent: bool = True):
        super().__init__(idempotent=True)  # a transactional producer is always idempotent

    def producer_settings(self, transactional_id: str | None = None) -> dict:
        if not transactional_id:
            raise ValueError("exactly_once needs a transactional_id")
        return {"transactional.id": transactional_id, "enable.idempotence": True, "acks": "all",
                "transaction.timeout.ms": self.TRANSACTION_TIMEOUT_MS,
                # librdkafka's send_offsets_to_transaction() can wait minutes after its group
                # coordinator's broker left; closing idle connections ends the wait
                "connections.max.idle.ms": COORDINATOR_STALL_WORKAROUND_MS}

    def open_output(self, bootstrap: str, transactional_id: str | None = None,
                    tuning: dict | None = None):
        """A transactional producer, initialised *before* anything is read: init_transactions()
        aborts what a crashed predecessor left open; only then are offsets and changelog final."""
        conf = {"bootstrap.servers": bootstrap, **(tuning or {}),
                **self.producer_settings(transactional_id)}
        return Transactions(bootstrap, transactional_id, config=conf)

    def commit_offsets(self, out, consumer: Consumer, offsets: list[TopicPartition],
                       group_metadata: object | None = None) -> None:
        """The offsets join the transaction; ``group_metadata`` is the group generation the
        records were read in (default: the consumer's current one)."""
        out.send_offsets(consumer, offsets, group_metadata)

    def run_batch(self, out, work, save_position) -> None:
        out.begin()
        try:
            work()
            crash_point("in-transaction-before-commit")
            save_position()
            crash_point("after-send-offsets-before-commit")
            out.commit()
        except BaseException:
            out.abort_after_error()
            raise
        crash_point("after-commit")


GUARANTEE_CLASSES: dict[str, type[Guarantee]] = {
    c.name: c for c in (AtMostOnce, AtLeastOnce, ExactlyOnce)}
GUARANTEES: tuple[str, ...] = tuple(GUARANTEE_CLASSES)


def guarantee(name: str, idempotent: bool | None = None) -> Guarantee:
    """The guarantee called ``name``; ``idempotent`` (default off) does not apply to
    exactly_once, whose transactional producer is always idempotent."""
    if name not in GUARANTEE_CLASSES:
        raise ValueError(f"unknown processing guarantee {name!r}; choose one of "
                         f"{', '.join(GUARANTEES)}")
    return GUARANTEE_CLASSES[name](idempotent=bool(idempotent))


def transactions(bootstrap: str, transactional_id: str, init: bool = True) -> Transactions:
    """A transactional producer with the exactly_once guarantee's settings."""
    return Transactions(bootstrap, transactional_id, init=init, config={
        "bootstrap.servers": bootstrap, **ExactlyOnce().producer_settings(transactional_id)})
