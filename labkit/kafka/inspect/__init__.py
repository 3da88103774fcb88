"""The inspector: what the broker stores and remembers, straight from the protocol.

    view = describe_topic(bootstrap, "payments")
    view.batches_frame()        # batches with producer id/epoch/sequence, flags, markers
    view.offsets_frame()        # log start, LSO, high watermark, group offsets
    print(view.to_text())       # or view.to_json() (what `labkit inspect --json` prints)

For repeated looks (a live dashboard) keep one ``Inspector(bootstrap)`` open.
"""
from __future__ import annotations

from collections.abc import Iterable

from labkit.kafka import names
from labkit.kafka.inspect.batches import Batch, Record, marker_type, parse_batches
from labkit.kafka.inspect.client import InspectError, Inspector, UnknownTopicError
from labkit.kafka.inspect.states import OffsetState, count_states, key_id, offset_states
from labkit.kafka.inspect.model import (PartitionOffsets, PartitionView, ProducerState, ReplicaMoment,
                                  ReplicaState, TopicView, Transaction)

__all__ = ["Batch", "Record", "Inspector", "InspectError", "UnknownTopicError",
           "PartitionOffsets", "PartitionView", "ProducerState", "ReplicaMoment", "ReplicaState", "TopicView", "Transaction",
           "describe_topic", "snapshot_topic", "marker_type", "parse_batches",
           "OffsetState", "offset_states", "count_states", "key_id"]


def snapshot_topic(inspector: Inspector, topic: str, groups: Iterable[str] | None = None) -> TopicView:
    """A TopicView through an open Inspector: offsets first, then batches below the high
    watermark read then, so the numbers and the batches agree. ``topic``: a learner's name
    or the broker's (``labkit.kafka.names``); the view carries the broker's."""
    topic = names.topic(topic)
    with inspector.one_metadata():
        offsets = inspector.offsets(topic)
        producers = inspector.producers(topic)
        partitions = tuple(
            PartitionView(p, o.log_start, o.lso, o.high_watermark,
                          batches=tuple(inspector.batches(topic, p, o.log_start, o.high_watermark)),
                          producers=tuple(s for s in producers if s.partition == p))
            for p, o in offsets.items())
    return TopicView(topic, partitions, inspector.group_offsets(topic, groups),
                     tuple(inspector.transactions(topic=topic)))


def describe_topic(bootstrap: str, topic: str) -> TopicView:
    """Batches, markers, offsets, producers, group offsets and open transactions of ``topic``.

    Raises UnknownTopicError (a ValueError) if the topic does not exist."""
    with Inspector(bootstrap) as inspector:
        return snapshot_topic(inspector, topic)
