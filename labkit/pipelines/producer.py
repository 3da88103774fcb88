"""A producer that moves records from a source (a list, as a file would be) into a topic.

Its position in the source is kept in a small progress topic, as Kafka Connect keeps source
offsets, so a restarted producer knows where to resume:

- at_most_once: save the position, *then* send the batch (acks=0, no retries).
- at_least_once: send and flush the batch (acks=all, retries), *then* save the position.
- exactly_once: the batch and the new position are written in *one* transaction (as
  KIP-618 does for Connect sources); the position is read back with read_committed.
"""
from __future__ import annotations

from collections.abc import Sequence

from labkit.kafka import names, topics
from labkit.pipelines.common import PIPELINE_TUNING, produce_in_halves
from labkit.pipelines.guarantee import guarantee as guarantee_named


def saved_position(bootstrap: str, progress_topic: str, isolation: str) -> int:
    recs = topics.read(bootstrap, progress_topic, isolation=isolation)
    return recs[-1].value["next"] if recs else 0


def send(out, topic: str, batch: Sequence[dict]) -> None:
    produce_in_halves(out, topic, [(str(r["key"]), r) for r in batch])


def run(bootstrap: str, output_topic: str, progress_topic: str, transactional_id: str,
        guarantee: str, records: Sequence[dict], batch_size: int = 10,
        idempotent: bool | None = None) -> None:
    """Write ``records`` to ``output_topic`` from the saved position to the end."""
    g = guarantee_named(guarantee, idempotent)
    output_topic, progress_topic = names.topic(output_topic), names.topic(progress_topic)
    out = g.open_output(bootstrap, transactional_id, PIPELINE_TUNING)
    position = saved_position(bootstrap, progress_topic, g.isolation)
    while position < len(records):
        batch = records[position:position + batch_size]
        nxt = position + len(batch)

        def save_position() -> None:
            out.produce(progress_topic, "position", {"next": nxt})
            out.flush(60)

        g.run_batch(out, lambda: send(out, output_topic, batch), save_position)
        position = nxt
