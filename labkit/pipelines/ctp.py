"""Consume-transform-produce: read payments, add the card fee, write them to another topic.

- at_most_once: commit the input offsets, *then* produce (acks=0, no retries).
- at_least_once: produce and flush (acks=all, retries), *then* commit the input offsets.
- exactly_once: a transactional producer writes the output and sends the input offsets
  *inside the same transaction* (send_offsets_to_transaction); the input is read with
  read_committed. A crash anywhere aborts the whole batch (the restarted producer's
  init_transactions() fences the old one and aborts its open transaction).

Two knobs reproduce well-known mistakes (the pitfalls notebook 05 shows):
``offsets="outside-before-commit" | "outside-after-commit"`` commits the offsets with the
consumer instead of in the transaction; ``offset_delta=0`` sends the last record's offset
instead of the next one to read. ``idempotent=True`` turns on the idempotent producer for
at_least_once (it dedupes retries, not reprocessing after a crash). ``side_effect_db=path``
also writes each payment to a SQLite ledger *outside* Kafka (like calling a card API): the
Kafka transaction cannot take that write back, so a crash before the commit repeats it.
``lookup=path`` screens each batch with the review threshold read from that table when the
batch is processed (labkit.pipelines.lookup): a transform that is not deterministic across a
replay when the table changes in between (labkit.experiments.nondeterminism).
``metadata_code`` is a learner's cell defining ``metadata_function(consumer, bootstrap,
group_id)``, whose result goes with the offsets into the transaction (notebook 06).
"""
from __future__ import annotations

from contextlib import closing

from confluent_kafka import Message

from labkit.kafka import names
from labkit.pipelines import consumer as ledger, learner
from labkit.pipelines.common import (PIPELINE_TUNING, commit, next_offsets, produce_in_halves,
                                     record_of)
from labkit.pipelines.group import GroupInput, first_start, bare_group_metadata, run_batches
from labkit.pipelines.lookup import current_threshold, screen
from labkit.pipelines.guarantee import guarantee as guarantee_named

OFFSET_MODES = ("in-transaction", "outside-before-commit", "outside-after-commit")
FENCING_MODES = ("group", "none")


def transform(record: dict) -> dict:
    """The business logic: a card fee of 2.9 % + 30 cents."""
    return {**record, "fee_cents": round(record["amount_cents"] * 0.029) + 30}


def emit(out, topic: str, batch: list[Message], lookup: str | None = None) -> None:
    items = [(msg.key().decode(), transform(record_of(msg))) for msg in batch]
    if lookup:  # the threshold as the table says *now*: a replay may see another one
        threshold = current_threshold(lookup)
        items = [(k, s) for k, v in items if (s := screen(v, threshold)) is not None]
    produce_in_halves(out, topic, items)


def run(bootstrap: str, input_topic: str, output_topic: str, group_id: str,
        transactional_id: str, guarantee: str, batch_size: int = 10,
        idempotent: bool | None = None, offsets: str = "in-transaction",
        offset_delta: int = 1, side_effect_db: str | None = None,
        group_protocol: str = "classic", instance_id: str | None = None,
        fencing: str = "group", max_batches: int | None = None, group_size: int = 1,
        lookup: str | None = None, metadata_code: str | None = None,
        metadata_function: str = "") -> None:
    """Transform ``input_topic`` into ``output_topic`` until the input's end.

    ``instance_id`` makes this instance a static group member; ``fencing="none"`` sends the
    transaction's offsets with the group id only (no generation), as before KIP-447;
    ``max_batches`` stops after that many batches (the zombie experiment's late instance).
    """
    g = guarantee_named(guarantee, idempotent)
    output_topic = names.topic(output_topic)  # the input's name: GroupInput (labkit.kafka.names)
    if offsets not in OFFSET_MODES:
        raise ValueError(f"offsets must be one of {OFFSET_MODES}, not {offsets!r}")
    if fencing not in FENCING_MODES:
        raise ValueError(f"unknown fencing {fencing!r}; choose one of {', '.join(FENCING_MODES)}")
    if not g.transactional:
        offsets = "in-transaction"  # no transaction to be outside of: the guarantee's own place
    out = g.open_output(bootstrap, transactional_id, PIPELINE_TUNING)  # fences a predecessor first
    bare = bare_group_metadata(bootstrap, group_id) if fencing == "none" else None
    metadata_of = learner.load(metadata_code, metadata_function) if metadata_code else None
    side_db = ledger.connect(side_effect_db) if side_effect_db else None
    done = 0

    with closing(GroupInput(bootstrap, input_topic, group_id, g, protocol=group_protocol,
                            instance_id=instance_id,
                            wait_for_members=first_start(group_size))) as source:
        def process(batch: list[Message]) -> None:
            nonlocal done
            positions = next_offsets(batch, offset_delta)
            # before anything polls
            read_in = (learner.call(metadata_of, consumer=source.consumer, bootstrap=bootstrap,
                                    group_id=group_id) if metadata_of else
                       bare or source.consumer.consumer_group_metadata())
            if side_db is not None:
                for msg in batch:  # autocommit: each write is final at once, whatever Kafka does
                    ledger.insert(side_db, msg)

            def save_position() -> None:
                if offsets == "in-transaction":
                    g.commit_offsets(out, source.consumer, positions, read_in)
                elif offsets == "outside-before-commit":
                    commit(source.consumer, positions)  # the mistake: survives an abort

            g.run_batch(out, lambda: emit(out, output_topic, batch, lookup), save_position)
            if offsets == "outside-after-commit":
                commit(source.consumer, positions)  # the mistake: a crash just before repeats
            done += 1
            if max_batches is not None and done >= max_batches:
                raise _Stop

        try:
            run_batches(source, batch_size, process)
        except _Stop:
            pass
    if side_db is not None:
        side_db.close()


class _Stop(Exception):
    """``max_batches`` reached."""
