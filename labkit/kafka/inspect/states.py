"""What each offset of a log *is*: committed data, open or aborted transaction data, a
COMMIT/ABORT marker, or a duplicate of a business id seen before.

A pure function of the batches read raw (READ_UNCOMMITTED): a transactional data batch's
fate is the next marker of the same producer id on that partition (none yet: still open).
Duplicates are judged among records a read_committed consumer could see (not aborted);
the caller says where a record's business id lives (``id_of``).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from labkit.kafka.inspect.batches import Batch, Record

COMMITTED, OPEN, ABORTED, COMMIT, ABORT, DUPLICATE = (
    "committed", "open", "aborted", "commit", "abort", "duplicate")
STATES = (COMMITTED, OPEN, ABORTED, COMMIT, ABORT, DUPLICATE)

IdOf = Callable[[Record], Hashable | None]


@dataclass(frozen=True)
class OffsetState:
    partition: int
    offset: int
    state: str
    producer_id: int
    business_id: Hashable | None = None


def key_id(record: Record) -> Hashable | None:
    """The default business id: the record key (as text when it is UTF-8)."""
    if record.key is None:
        return None
    try:
        return record.key.decode()
    except UnicodeDecodeError:
        return record.key


def _fates(batches: list[Batch]) -> dict[int, str]:
    """base_offset of each transactional data batch -> COMMITTED / ABORTED / OPEN."""
    fates: dict[int, str] = {}
    next_marker: dict[int, str] = {}  # producer id -> the marker that ends its transaction
    for b in reversed(batches):
        if b.is_control:
            next_marker[b.producer_id] = COMMITTED if b.marker == "COMMIT" else ABORTED
        elif b.is_transactional:
            fates[b.base_offset] = next_marker.get(b.producer_id, OPEN)
    return fates


def offset_states(batches: Iterable[Batch], id_of: IdOf | None = key_id) -> list[OffsetState]:
    """One OffsetState per offset held by ``batches`` (one partition or several)."""
    by_partition: dict[int, list[Batch]] = {}
    for b in batches:
        by_partition.setdefault(b.partition, []).append(b)
    out: list[OffsetState] = []
    for partition, part in sorted(by_partition.items()):
        part.sort(key=lambda b: b.base_offset)
        fates = _fates(part)
        seen: set = set()
        for b in part:
            if b.is_control:
                out.append(OffsetState(partition, b.base_offset,
                                       COMMIT if b.marker == "COMMIT" else ABORT, b.producer_id))
                continue
            fate = fates.get(b.base_offset, COMMITTED)  # non-transactional: visible at once
            records = b.records or tuple(Record(o, None, None)
                                         for o in range(b.base_offset, b.last_offset + 1))
            for r in records:
                bid = id_of(r) if id_of is not None and b.records else None
                state = fate
                if fate != ABORTED and bid is not None:
                    state = DUPLICATE if bid in seen else fate
                    seen.add(bid)
                out.append(OffsetState(partition, r.offset, state, b.producer_id, bid))
    return out


def count_states(states: Iterable[OffsetState]) -> dict[str, int]:
    counts = dict.fromkeys(STATES, 0)
    for s in states:
        counts[s.state] += 1
    return counts
