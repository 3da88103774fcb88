"""The data every widget draws, live (HTML) or static (matplotlib): one ``Snapshot``.

Widgets never compute the audit: counters come from the caller's audit function, as an
AuditReport or a mapping with produced / delivered / duplicated / lost.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from labkit.kafka.inspect.states import ABORT, ABORTED, COMMIT, COMMITTED, DUPLICATE, OPEN, OffsetState

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


# ---------------------------------------------------------------- what the views say
# Labels, scales and captions are computed here, once: the live HTML view (html.py) and
# the static PNG (static.py) only place them, so the two pictures cannot say different things.

MARK_LETTER = {"commit": "C", "abort": "A", "duplicate": "D"}  # lettered cells of the strip
PRODUCER_HEAD = ("partition", "producer id", "epoch", "last sequence", "transaction",
                 "transactional id")
ALARM_COLOR, TEXT_COLOR = "#c0392b", "#222"
RIGHT_FROM = 0.6  # labels right of this share of the scale hang to the left of their tick


def view_title(view: str, topic: str) -> str:
    return {"log": f"log of {topic}", "offsets": f"offsets of {topic}",
            "producers": "producer state (DescribeProducers)", "counters": "audit"}[view]


def strip_caption(snap: Snapshot, partition: int) -> str:
    """The heading of one partition in the log strip: which offsets the window shows."""
    cells = snap.cells_of(partition)
    span = f"offsets {cells[0].offset}–{cells[-1].offset}" if cells else "empty"
    return f"partition {partition} ({span})"


def cell_title(cell: OffsetState) -> str:
    label = STATE_STYLE[cell.state][0]
    return f"offset {cell.offset}: {label}" + (
        f", id {cell.business_id}" if cell.business_id is not None else "")


def offsets_scale(snap: Snapshot) -> int:
    """One scale for every partition's bar: past the furthest offset anyone points at."""
    ends = [v for t in snap.tracks
            for v in (t.high_watermark, t.position or 0, *t.committed.values())]
    return max([10, *ends]) + 1


@dataclass(frozen=True)
class Label:
    """A text pinned to an offset of a partition's bar (``kind`` names it for tests)."""

    text: str
    offset: int
    color: str
    kind: str

    def hangs_left(self, scale_end: int) -> bool:
        return self.offset > scale_end * RIGHT_FROM


def labels_above(t: Track) -> list[Label]:
    return [Label(f"log start {t.log_start}", t.log_start, "#333", "start"),
            Label(f"high watermark {t.high_watermark}", t.high_watermark, "#333", "hw")]


def labels_below(t: Track) -> list[Label]:
    """LSO, each group's committed offset, the live consumer's position."""
    lso = f"LSO {t.lso}" + (" = HW" if t.lso == t.high_watermark else " (open transaction)")
    out = [Label(lso, t.lso, "#333", "lso")]
    out += [Label(f"group {g} committed {o}", o, "#555", "group")
            for g, o in sorted(t.committed.items())]
    if t.position is not None:
        out.append(Label(f"consumer position {t.position}", t.position, "#1f5fbf", "position"))
    return out


def counter_values(snap: Snapshot) -> list[tuple[str, int, str]]:
    """(name, value, colour) per counter; duplicated or lost above 0 is an alarm."""
    out = []
    for name in COUNTER_NAMES:
        value = getattr(snap.counts, name) if snap.counts else 0
        alarm = name in ("duplicated", "lost") and value > 0
        out.append((name, value, ALARM_COLOR if alarm else TEXT_COLOR))
    return out


def producer_rows(snap: Snapshot) -> list[tuple[str, ...]]:
    """The producer-state table's cells, as text (empty list: no producer state yet)."""
    return [(str(r.partition), str(r.producer_id), str(r.producer_epoch), str(r.last_sequence),
             f"open since {r.txn_start_offset}" if r.open_transaction else "none",
             r.transactional_id or "") for r in snap.producers]


NO_PRODUCERS = "no producer state yet"
