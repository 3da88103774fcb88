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
"""
from __future__ import annotations

from contextlib import closing

from confluent_kafka import Message

from labkit.pipelines.common import (OFFSET_MODES, check_guarantee, in_transaction, next_offsets,
                                     open_input, output_for, produce_in_halves, record_of,
                                     run_batches, with_offsets)
from labkit.pipelines import consumer as ledger



def transform(record: dict) -> dict:
    """The business logic: a card fee of 2.9 % + 30 cents."""
    return {**record, "fee_cents": round(record["amount_cents"] * 0.029) + 30}


def emit(out, topic: str, batch: list[Message]) -> None:
    produce_in_halves(out, topic, [(msg.key().decode(), transform(record_of(msg))) for msg in batch])


def run(bootstrap: str, input_topic: str, output_topic: str, group_id: str,
        transactional_id: str, guarantee: str, batch_size: int = 10,
        idempotent: bool | None = None, offsets: str = "in-transaction",
        offset_delta: int = 1, side_effect_db: str | None = None) -> None:
    """Transform ``input_topic`` into ``output_topic`` until the input's end."""
    check_guarantee(guarantee)
    if offsets not in OFFSET_MODES:
        raise ValueError(f"offsets must be one of {OFFSET_MODES}, not {offsets!r}")
    out, isolation = output_for(bootstrap, guarantee, transactional_id, idempotent)
    consumer = open_input(bootstrap, input_topic, group_id, isolation=isolation)
    side_db = ledger.connect(side_effect_db) if side_effect_db else None

    def process(batch: list[Message]) -> None:
        positions = next_offsets(batch, offset_delta)
        if side_db is not None:
            for msg in batch:  # autocommit: each write is final at once, whatever Kafka does
                ledger.insert(side_db, msg)
        if guarantee == "exactly_once":
            in_transaction(out, consumer, positions, lambda: emit(out, output_topic, batch), offsets)
        else:
            with_offsets(guarantee, consumer, positions, lambda: emit(out, output_topic, batch))

    with closing(consumer):
        run_batches(consumer, batch_size, process)
    if side_db is not None:
        side_db.close()

