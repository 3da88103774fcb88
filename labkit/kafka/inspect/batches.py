"""Record batches as the broker stores them: raw v2 batch bytes -> plain ``Batch`` values.

Client libraries hide what the inspector shows: producer id/epoch/sequence, the
transactional and control attribute bits, and the COMMIT/ABORT marker batches that take an
offset each. kio parses the batch; this module only names the bits.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from kio.records.readers import read_batch
from kio.serial.errors import BufferUnderflow

# Attribute bits of a v2 record batch (see docs/kafka-behaviour: "Record batch v2 layout").
COMPRESSION_MASK = 0x07
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
# Control record key: int16 version, int16 type.
MARKER_TYPES = {0: "ABORT", 1: "COMMIT"}

_HEADER = struct.Struct(">qiibIhiqqqhii")  # the 61 bytes before the records
_BATCH_OVERHEAD = 12  # baseOffset (8) + batchLength (4) are not counted in batchLength


@dataclass(frozen=True)
class Record:
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class Batch:
    """One record batch. ``marker`` is COMMIT/ABORT for control batches, else None."""

    partition: int
    base_offset: int
    last_offset: int
    record_count: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    is_control: bool
    marker: str | None
    compression: int = 0
    # Empty for compressed batches: kio reads uncompressed records only.
    records: tuple[Record, ...] = ()
    # The batch's largest timestamp (ms): a marker's is when its partition leader wrote it,
    # the moment the transaction's records became readable (read_committed); -1 if none.
    max_timestamp: int = -1

    # The exact keys of `labkit inspect --json` (a contract: scripts read them).
    JSON_KEYS = ("base_offset", "last_offset", "producer_id", "producer_epoch",
                 "base_sequence", "is_transactional", "is_control", "marker")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.JSON_KEYS}


def marker_type(key: bytes | None) -> str:
    """COMMIT or ABORT from a control record's key (int16 version, int16 type)."""
    if key is None or len(key) < 4:
        raise ValueError(f"not a control record key: {key!r}")
    _version, kind = struct.unpack(">hh", key[:4])
    return MARKER_TYPES.get(kind, f"CONTROL-{kind}")


def parse_batches(data: bytes, partition: int) -> Iterator[Batch]:
    """Every complete batch in a Fetch response's records bytes.

    A Fetch may end in the middle of a batch (the broker cuts at max bytes); that tail is
    dropped here and fetched again from its base offset.
    """
    view = memoryview(data)
    pos = 0
    while pos + _HEADER.size <= len(data):
        (base_offset, length, _leader_epoch, magic, _crc, attributes, last_delta, _t0, max_ts,
         producer_id, producer_epoch, base_sequence, count) = _HEADER.unpack_from(view, pos)
        end = pos + _BATCH_OVERHEAD + length
        if end > len(data):
            return
        if magic != 2:
            raise ValueError(f"record batch magic {magic} at offset {base_offset}: only v2 "
                             "batches (Kafka >= 0.11) can be inspected")
        compression = attributes & COMPRESSION_MASK
        records: tuple[Record, ...] = ()
        if compression == 0:
            try:
                batch, _size = read_batch(view, pos)
            except BufferUnderflow:
                return
            records = tuple(Record(int(r.offset), r.key, r.value) for r in batch.records)
        is_control = bool(attributes & CONTROL_BIT)
        yield Batch(
            partition=partition,
            base_offset=base_offset,
            last_offset=base_offset + last_delta,
            record_count=count,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            is_transactional=bool(attributes & TRANSACTIONAL_BIT),
            is_control=is_control,
            marker=marker_type(records[0].key) if is_control and records else None,
            compression=compression,
            records=records,
            max_timestamp=max_ts,
        )
        pos = end
