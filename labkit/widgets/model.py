"""The data every widget draws, live (HTML) or static (matplotlib): one ``Snapshot``.

Widgets never compute the audit: counters come from the caller's audit function, as an
AuditReport or a mapping with produced / delivered / duplicated / lost.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from labkit.inspect.states import ABORT, ABORTED, COMMIT, COMMITTED, DUPLICATE, OPEN, OffsetState

# state -> (legend label, colour); the live and the static picture use the same ones.
STATE_STYLE: dict[str, tuple[str, str]] = {
    COMMITTED: ("committed data", "#4c9f70"),
    OPEN: ("open transaction", "#f2b134"),
    ABORTED: ("aborted data", "#c8c8c8"),
    COMMIT: ("COMMIT marker", "#1f5fbf"),
    ABORT: ("ABORT marker", "#c0392b"),
    DUPLICATE: ("duplicate", "#8e44ad"),
}
COUNTER_NAMES = ("produced", "delivered", "duplicated", "lost")


@dataclass(frozen=True)
class Track:
    """One partition's offsets line: where the log starts and ends, and who is where."""

    partition: int
    log_start: int
    lso: int
    high_watermark: int
    committed: dict[str, int] = field(default_factory=dict)  # group -> committed offset
    position: int | None = None  # the live consumer's position, if the experiment gives one


@dataclass(frozen=True)
class ProducerRow:
    partition: int
    producer_id: int
    producer_epoch: int
    last_sequence: int
    open_transaction: bool
    txn_start_offset: int | None = None
    transactional_id: str | None = None


@dataclass(frozen=True)
class Counts:
    produced: int = 0
    delivered: int = 0
    duplicated: int = 0
    lost: int = 0

    @classmethod
    def of(cls, audit: object) -> "Counts":
        """From an AuditReport (delivered = delivered_unique) or a mapping."""
        if audit is None:
            return cls()
        if not isinstance(audit, Mapping):
            audit = {k: getattr(audit, k) for k in
                     ("produced", "delivered_unique", "delivered", "duplicated", "lost")
                     if hasattr(audit, k)}
        delivered = audit.get("delivered", audit.get("delivered_unique", 0))
        try:
            return cls(int(audit.get("produced", 0)), int(delivered),
                       int(audit.get("duplicated", 0)), int(audit.get("lost", 0)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the audit function must return counts {COUNTER_NAMES}, got "
                             f"{dict(audit)!r}") from exc


@dataclass(frozen=True)
class Snapshot:
    topic: str
    tracks: tuple[Track, ...] = ()
    cells: tuple[OffsetState, ...] = ()  # the log strip's window, all partitions
    counts: Counts | None = None
    producers: tuple[ProducerRow, ...] = ()
    finished: bool = False

    def cells_of(self, partition: int) -> list[OffsetState]:
        return [c for c in self.cells if c.partition == partition]
