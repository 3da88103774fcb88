"""The exactly-once loop of notebook 05b in plain confluent-kafka, and the same loop as the
client of an experiment.

    copy_fees(consumer, producer, output, records, before_commit, after_end, errors)
    FeeLoop()(run)                   # the loop (or the learner's) as a run's client
    errors_by_class([("a batch slower than ...", "_FENCED (fatal)")])   # notebook 06's table

``copy_fees`` reads an input partition and writes the fees of each batch of 10 in one
transaction, with its input offsets; commit errors are handled as librdkafka classifies
them (``classified``): retriable, call again; abortable, abort and read the batch again;
fatal, end the app. The coordinator-failover, txn-timeout and poll-interval-zombie
experiments run it (or a learner's version of it) under their faults.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from labkit.kafka import topics
from labkit.kafka.clientlog import COORDINATOR_STALL_WORKAROUND_MS, client_config
from labkit.kafka.inspect import InspectError, Inspector
from labkit.pipelines.error_classes import kind
from labkit.pipelines.ctp import transform
from labkit.progress import beat, step

BATCH = 10
COMMIT_RETRY_S = 120  # retriable errors of commit_transaction: called again this long, then raised


def copy_fees(consumer: Consumer, producer: Producer, output: str, records: int,
              before_commit: Callable[[int], None], after_end: Callable[[int, bool], None],
              errors: list[str]) -> None:
    """The exactly-once loop: each batch's fees and input offsets in one transaction, under
    the production loop's error rule (``production_loop``; notebook 06's ``copy_fees``).

    ``before_commit(batch)`` and ``after_end(batch, committed)`` (batches counted from 1,
    a batch read again counts anew) are where the lab's faults go. Everything from
    ``produce()`` to ``commit_transaction()`` is inside the ``try``: a fatal error (e.g.
    fenced) ends the app, as does a consumer's ``_FATAL`` event; ``commit_transaction``'s
    retriable errors are retried (``commit``, for 2 minutes at most); anything else aborts
    the transaction and reads the batch again from the committed offsets."""
    batch_no, done = 0, 0
    while done < records:
        batch = []
        for msg in consumer.consume(BATCH, timeout=1.0):
            if msg.error() is None:
                batch.append(msg)
            elif msg.error().code() == KafkaError._FATAL:  # e.g. our group.instance.id taken
                raise KafkaException(msg.error())
        if not batch:
            continue
        batch_no += 1
        producer.begin_transaction()
        try:
            for msg in batch:
                fee = transform(topics.decode(msg.value()))
                producer.produce(output, key=msg.key(), value=topics.encode(fee))
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 60)
            before_commit(batch_no)
            commit(producer, errors)
        except KafkaException as exc:
            if exc.args[0].fatal():
                raise  # fenced: this producer is done; a new instance takes over
            producer.abort_transaction(60)  # abortable, or any other error in the transaction
            rewind(consumer)
            after_end(batch_no, False)
            continue
        done = batch[-1].offset() + 1
        after_end(batch_no, True)


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
    """An error as the app sees it: its name and its class, asked as the production loop
    asks (``error_classes.kind``), e.g. "_FENCED (fatal)"."""
    return f"{err.name()} ({kind(err)})"


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


def markers_written(bootstrap: str, topic: str) -> bool:
    """Whether every partition of ``topic`` has its last stable offset at its high
    watermark (no transaction waits for a marker there)."""
    try:
        with Inspector(bootstrap, timeout_s=5) as inspector:
            return all(o.lso == o.high_watermark for o in inspector.offsets(topic).values())
    except (InspectError, OSError):  # the partition's leader moved and is settling in
        return False


@dataclass
class FeeLoop:
    """``copy_fees`` (or the learner's loop in its place, ``run.pipeline``) as the client of
    a run (``labkit.experiments.context.RunContext``), in the experiment's thread: its
    transactional producer talks to ``run.client_bootstrap`` (a fault proxy's when one is
    in between), its read_committed consumer reads the run's input from the cluster, the
    fees go to the run's output.

    Its hooks report the events faults fire on: ``before-commit`` (``batch``: the batch's
    records flushed to the log, its offsets sent, its transaction open) and ``batch-ended``
    (``batch``, ``committed``, ``outcome``); a batch's end that no fault told the story of is
    a line of the timeline. Batches are counted over the whole run. A fatal error is
    answered ``fatal_restarts`` times as the app should: a new producer with the same
    transactional.id, the consumer back at its committed offsets. The run's facts get
    ``errors`` (as ``classified``) and ``producers`` (instances used)."""

    group_id: str | None = None  # default: the run's
    producer_settings: dict = field(default_factory=dict)
    consumer_settings: dict = field(default_factory=dict)
    fatal_restarts: int = 0
    loop: Callable[..., None] | None = None  # default: run.pipeline, else copy_fees
    producer: Producer | None = None  # the current one (``open``)
    _before: int = field(default=0, init=False, repr=False)  # the earlier producers' batches
    _last: int = field(default=0, init=False, repr=False)  # the last batch that reached its commit

    def open(self, run: Any) -> Producer:
        """A new producer with the run's transactional.id, registered with its coordinator
        (init_transactions: the coordinator knows the id from here on, the producer before
        it is fenced)."""
        producer = Producer(client_config({"bootstrap.servers": run.client_bootstrap,
                                           "transactional.id": run.transactional_id(),
                                           # send_offsets_to_transaction() can otherwise
                                           # wait minutes after a coordinator moves
                                           "connections.max.idle.ms":
                                               COORDINATOR_STALL_WORKAROUND_MS,
                                           **self.producer_settings}))
        producer.init_transactions(60)
        run.observe(producers=run.facts.get("producers", 0) + 1)
        self.producer = producer
        return producer

    def __call__(self, run: Any) -> None:
        loop = self.loop or run.pipeline or copy_fees
        errors: list = []  # the loop's own to append to; the run observes it at the end
        consumer = Consumer(client_config({
            "bootstrap.servers": run.bootstrap, "group.id": self.group_id or run.group_id,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            # end-of-partition events, for a learner's loop that stops at the input's end
            # (notebook 06's); the lab's own loop counts its records instead
            "enable.partition.eof": True, **self.consumer_settings}))
        consumer.subscribe([run.topics["input"]])
        try:
            producer = self.producer or self.open(run)
            while True:
                try:
                    loop(consumer, producer, run.topics["output"], len(run.inputs),
                         lambda n: self._before_commit(run, n),
                         lambda n, committed: self._after_end(run, n, committed), errors)
                    break
                except KafkaException as exc:
                    err = exc.args[0]
                    if not err.fatal() or run.facts["producers"] > self.fatal_restarts:
                        raise
                    if not errors or errors[-1] != classified(err):
                        errors.append(classified(err))  # raised outside commit
                    run.step(f"{classified(err)}: a new producer with the same "
                             "transactional.id, the consumer back at its committed offsets")
                    rewind(consumer)
                    self._before = self._last  # the new loop counts from 1 again
                    producer = self.open(run)
        finally:
            consumer.close()
            run.observe(errors=list(errors))
        run.step("every input batch committed")

    def _before_commit(self, run: Any, n: int) -> None:
        batch = self._last = self._before + n
        self.producer.flush(30)  # the batch's records are in the log, its transaction open
        step(f"batch {batch}: records and offsets sent", f"commit_transaction() of batch {batch}")
        run.event("before-commit", batch=batch)

    def _after_end(self, run: Any, n: int, committed: bool) -> None:
        batch = self._before + n
        outcome = "committed" if committed else "aborted, to be read again"
        waiting = f"batch {batch + 1}: consume, produce, send_offsets_to_transaction()"
        beat(waiting)
        if not run.event("batch-ended", batch=batch, committed=committed, outcome=outcome):
            run.step(f"batch {batch}: {outcome}", waiting)
