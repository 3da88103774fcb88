"""Where a dashboard's snapshots come from: the inspector (what the broker holds) plus the
experiment's own callables (consumer position, audit). Batches are immutable once written,
so each partition's log is fetched incrementally: only offsets not seen yet."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from labkit.kafka.inspect import Batch, InspectError, Inspector, offset_states
from labkit.kafka.inspect.states import IdOf, key_id
from labkit.widgets.model import Counts, ProducerRow, Snapshot, Track

class Source:
    def __init__(self, bootstrap: str, topic: str, *,
                 audit: Callable[[], object] | None = None,
                 position: Callable[[], int | Mapping[int, int] | None] | None = None,
                 id_of: IdOf | None = key_id,
                 groups: Iterable[str] | None = None,
                 window: int = 120):
        if window < 1:
            raise ValueError(f"window must be >= 1 offset, not {window}")
        self.topic, self.audit, self.position, self.id_of = topic, audit, position, id_of
        self.window = window
        self.inspector = Inspector(bootstrap)
        try:
            self.inspector.leaders(topic)  # unknown topic -> a clear error now, not in a thread
        except InspectError as exc:  # the topic exists; its leader is being elected
            if not exc.retriable:
                raise
        self.groups = list(groups) if groups is not None else None  # None: every group
        self._logs: dict[int, list[Batch]] = {}

    def close(self) -> None:
        self.inspector.close()

    def _follow(self, partition: int, log_start: int, high_watermark: int) -> list[Batch]:
        log = self._logs.get(partition, [])
        if log and log[-1].last_offset >= high_watermark:
            log = []  # the log was truncated (leader change): read it again
        log = [b for b in log if b.last_offset >= log_start]
        start = log[-1].last_offset + 1 if log else log_start
        if start < high_watermark:
            log += self.inspector.batches(self.topic, partition, start, high_watermark)
        self._logs[partition] = log
        return log

    def _positions(self) -> dict[int, int]:
        got = self.position() if self.position is not None else None
        if got is None:
            return {}
        if isinstance(got, Mapping):
            return {int(p): int(o) for p, o in got.items()}
        return {0: int(got)}

    def collect(self, finished: bool = False) -> Snapshot:
        with self.inspector.one_metadata():  # the topic's leaders asked once per refresh
            offsets = self.inspector.offsets(self.topic)
            groups = self.inspector.group_offsets(self.topic, self.groups)
            positions = self._positions()
            tracks, cells = [], []
            for p, o in offsets.items():
                tracks.append(Track(p, o.log_start, o.lso, o.high_watermark,
                                    {g: offs[p] for g, offs in groups.items() if p in offs},
                                    positions.get(p)))
                states = offset_states(self._follow(p, o.log_start, o.high_watermark), self.id_of)
                cells.extend(states[-self.window:])
            txn_ids = {t.producer_id: t.transactional_id
                       for t in self.inspector.transactions(topic=self.topic)}
            producers = tuple(
                ProducerRow(s.partition, s.producer_id, s.producer_epoch, s.last_sequence,
                            s.open_transaction, s.txn_start_offset, txn_ids.get(s.producer_id))
                for s in self.inspector.producers(self.topic))
            counts = Counts.of(self.audit()) if self.audit is not None else None
            return Snapshot(self.topic, tuple(tracks), tuple(cells), counts, producers, finished)
