"""Plain values the inspector returns, with JSON, text and DataFrame views."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from labkit.kafka.inspect.batches import Batch


@dataclass(frozen=True)
class PartitionOffsets:
    partition: int
    log_start: int
    lso: int  # last stable offset: read_committed consumers stop here
    high_watermark: int


@dataclass(frozen=True)
class ReplicaState:
    """Who holds one partition (DescribeTopicPartitions, as the answering broker knows it).

    ``leader`` None: no leader (the partition is offline). ``isr``: the in-sync replicas,
    the only ones a clean election may choose; ``elr``: eligible leader replicas (KIP-966),
    replicas that left the ISR while it was below min.insync.replicas and so still hold
    every acknowledged record."""

    partition: int
    leader: int | None
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    elr: tuple[int, ...]

    def text(self) -> str:
        leader = "none (offline)" if self.leader is None else self.leader
        return (f"leader {leader}, replicas {list(self.replicas)}, ISR {list(self.isr)}"
                + (f", ELR {list(self.elr)}" if self.elr else ""))


@dataclass(frozen=True)
class ReplicaMoment:
    """One partition's replicas at one moment of a failure experiment, beside what each
    broker's process was doing then (``running``, ``frozen`` or ``down``, as the OS saw it).
    ``state`` None: no running broker answered."""

    seconds: float
    step: str
    state: ReplicaState | None
    processes: dict[int, str]

    def state_text(self) -> str:
        return self.state.text() if self.state is not None else "no running broker answered"

    def processes_text(self) -> str:
        return ", ".join(f"{b} {what}" for b, what in sorted(self.processes.items()))

    def text(self) -> str:
        return (f"{self.seconds:5.1f} s  {self.state_text()}; brokers {self.processes_text()}"
                f" (after: {self.step})")


@dataclass(frozen=True)
class ProducerState:
    """What a partition leader remembers about one producer (DescribeProducers)."""

    partition: int
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    txn_start_offset: int | None  # first offset of its open transaction here, if any

    @property
    def open_transaction(self) -> bool:
        return self.txn_start_offset is not None

    @classmethod
    def from_kio(cls, partition: int, s) -> "ProducerState":
        start = int(s.current_txn_start_offset)
        return cls(partition, int(s.producer_id), int(s.producer_epoch), int(s.last_sequence),
                   int(s.last_timestamp), int(s.coordinator_epoch), None if start < 0 else start)


@dataclass(frozen=True)
class Transaction:
    """One transactional.id at its coordinator (ListTransactions + DescribeTransactions)."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_time_ms: int | None
    partitions: tuple[tuple[str, int], ...]

    @classmethod
    def from_kio(cls, s) -> "Transaction":
        start = s.transaction_start_time
        start_ms = int(start.timestamp() * 1000) if start is not None and start.timestamp() > 0 else None
        return cls(str(s.transactional_id), str(s.transaction_state), int(s.producer_id),
                   int(s.producer_epoch), int(s.transaction_timeout.total_seconds() * 1000),
                   start_ms, tuple((str(t.topic), int(p)) for t in s.topics for p in t.partitions))


@dataclass(frozen=True)
class PartitionView:
    partition: int
    log_start: int
    lso: int
    high_watermark: int
    batches: tuple[Batch, ...] = ()
    producers: tuple[ProducerState, ...] = ()

    def to_dict(self) -> dict:
        return {"partition": self.partition, "log_start": self.log_start, "lso": self.lso,
                "high_watermark": self.high_watermark,
                "batches": [b.to_dict() for b in self.batches],
                "producers": [_producer_dict(s) for s in self.producers]}


def _producer_dict(s: ProducerState) -> dict:
    return {"producer_id": s.producer_id, "producer_epoch": s.producer_epoch,
            "last_sequence": s.last_sequence, "txn_start_offset": s.txn_start_offset}


@dataclass(frozen=True)
class TopicView:
    """Everything the inspector sees about one topic at one moment."""

    topic: str
    partitions: tuple[PartitionView, ...]
    group_offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    transactions: tuple[Transaction, ...] = ()

    def partition(self, index: int) -> PartitionView:
        for p in self.partitions:
            if p.partition == index:
                return p
        raise ValueError(f"{self.topic!r} has partitions {[p.partition for p in self.partitions]}, "
                         f"not {index}")

    @property
    def batches(self) -> list[Batch]:
        return [b for p in self.partitions for b in p.batches]

    # ------------------------------------------------------------ views

    def to_dict(self) -> dict:
        return {"topic": self.topic,
                "partitions": [p.to_dict() for p in self.partitions],
                "groups": {g: {str(p): o for p, o in offs.items()}
                           for g, offs in self.group_offsets.items()},
                "transactions": [{"transactional_id": t.transactional_id, "state": t.state,
                                  "producer_id": t.producer_id, "producer_epoch": t.producer_epoch,
                                  "partitions": [list(tp) for tp in t.partitions]}
                                 for t in self.transactions]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def batches_frame(self) -> pd.DataFrame:
        """One row per batch: partition, offsets, record count, producer, flags, marker."""
        columns = ["partition", "base_offset", "last_offset", "record_count", *Batch.JSON_KEYS[2:]]
        rows = [{c: getattr(b, c) for c in columns} for b in self.batches]
        return pd.DataFrame(rows, columns=columns)

    def transactions_frame(self, partition: int = 0) -> pd.DataFrame:
        """One row per transaction on ``partition``, in log order: the epoch(s) and first
        sequence number of its data, and its marker (COMMIT/ABORT) with the marker's epoch.
        Shows which protocol the producer spoke: classic keeps the epoch and counts sequences
        on; transaction version 2 bumps the epoch at every commit and starts sequences at 0."""
        rows, epochs, first_seq = [], set(), None
        for b in self.batches:
            if b.partition != partition:
                continue
            if b.is_control:
                rows.append({"data epoch": ", ".join(map(str, sorted(epochs))),
                             "first sequence": first_seq, "marker": b.marker,
                             "marker epoch": b.producer_epoch})
                epochs, first_seq = set(), None
            else:
                epochs.add(b.producer_epoch)
                first_seq = b.base_sequence if first_seq is None else first_seq
        return pd.DataFrame(rows, columns=["data epoch", "first sequence", "marker", "marker epoch"],
                            index=pd.RangeIndex(1, len(rows) + 1, name="transaction")).astype(
            {"first sequence": "Int64", "marker epoch": "Int64"})

    def records_frame(self, value_of: Callable[[bytes | None], object] | None = None) -> pd.DataFrame:
        """One row per data record (markers left out): partition, offset, its batch's base
        offset and producer id/epoch, the record's own sequence number (base sequence + its
        place in the batch; -1 without idempotence) and its value, through ``value_of``
        (e.g. ``lambda v: topics.decode(v)["id"]``) when given."""
        rows = [{"partition": b.partition, "offset": r.offset, "batch": b.base_offset,
                 "producer_id": b.producer_id, "producer_epoch": b.producer_epoch,
                 "sequence": b.base_sequence + r.offset - b.base_offset if b.base_sequence >= 0 else -1,
                 "value": value_of(r.value) if value_of is not None else r.value}
                for b in self.batches if not b.is_control for r in b.records]
        return pd.DataFrame(rows, columns=["partition", "offset", "batch", "producer_id",
                                           "producer_epoch", "sequence", "value"])

    def offsets_frame(self) -> pd.DataFrame:
        """One row per partition: log start, LSO, high watermark, and each group's offset."""
        rows = []
        for p in self.partitions:
            row = {"partition": p.partition, "log_start": p.log_start, "lso": p.lso,
                   "high_watermark": p.high_watermark}
            for group, offsets in self.group_offsets.items():
                row[f"group:{group}"] = offsets.get(p.partition)
            rows.append(row)
        return pd.DataFrame(rows).set_index("partition")

    def producers_frame(self) -> pd.DataFrame:
        columns = ["partition", "producer_id", "producer_epoch", "last_sequence",
                   "open_transaction", "txn_start_offset"]
        rows = [{c: getattr(s, c) for c in columns} for p in self.partitions for s in p.producers]
        return pd.DataFrame(rows, columns=columns)

    def to_text(self, producer_ids: bool = True) -> str:
        """A plain-text report without times or addresses. Producer ids depend on what the
        broker did before; ``producer_ids=False`` names producers P1, P2, ... in order of
        appearance instead, so a notebook's output stays the same from run to run (nbval)."""
        names: dict[int, str] = {}

        def pid(producer_id: int) -> str:
            if producer_ids or producer_id < 0:
                return str(producer_id)
            return names.setdefault(producer_id, f"P{len(names) + 1}")

        lines = [f"topic {self.topic}: {len(self.partitions)} partition(s)"]
        for p in self.partitions:
            lines.append(f"partition {p.partition}: log start {p.log_start}, LSO {p.lso}, "
                         f"high watermark {p.high_watermark}"
                         + ("  (open transaction holds the LSO back)" if p.lso < p.high_watermark else ""))
            if p.batches:
                lines.append(f"  {'offsets':>11}  {'n':>3}  {'producer':>8}  {'epoch':>5}  "
                             f"{'base seq':>8}  {'txn':<3}  kind")
            for b in p.batches:
                span = f"{b.base_offset}" if b.base_offset == b.last_offset else f"{b.base_offset}-{b.last_offset}"
                kind = f"{b.marker} marker" if b.is_control else "data"
                lines.append(f"  {span:>11}  {b.record_count:>3}  {pid(b.producer_id):>8}  "
                             f"{b.producer_epoch:>5}  {b.base_sequence:>8}  "
                             f"{'yes' if b.is_transactional else 'no':<3}  {kind}")
            for s in p.producers:
                txn = f"open since offset {s.txn_start_offset}" if s.open_transaction else "none open"
                lines.append(f"  producer {pid(s.producer_id)} epoch {s.producer_epoch} "
                             f"last sequence {s.last_sequence}, transaction: {txn}")
        for group, offsets in self.group_offsets.items():
            lines.append(f"group {group}: " + ", ".join(f"p{p}={o}" for p, o in offsets.items()))
        for t in self.transactions:
            lines.append(f"open transaction {t.transactional_id}: {t.state}, producer "
                         f"{pid(t.producer_id)} epoch {t.producer_epoch}")
        return "\n".join(lines)
