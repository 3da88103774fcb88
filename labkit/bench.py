"""What each delivery guarantee costs: producer throughput and end-to-end latency, measured.

    df = bench.compare_guarantees(bootstrap, records=20_000)     # one row per run
    bench.summarize(df)                                           # medians, vs at_least_once
    bench.commit_sweep(bootstrap, sizes=(1, 10, 100, 1000))       # records per transaction

Every run writes ``records`` values of ``value_bytes`` to a fresh one-partition topic with a
real confluent-kafka producer, while a real consumer reads them back with read_committed.
Each value starts with the producer's clock at ``produce()`` and a sequence number, so the
consumer measures end-to-end latency (produce call to delivery to the application, buffering
and the wait for the transaction's commit included) and counts what arrived.

The measured configurations are the guarantee classes' own producer settings
(``labkit.pipelines.guarantee``, the ones the pipelines of notebooks 01-07 run), with
linger.ms=5 instead of the pipelines' 50 (which only keeps crash experiments repeatable):

- ``at_most_once``: ``AtMostOnce`` (acks=0, no retries, no idempotence: fire and forget).
- ``at_least_once``: ``AtLeastOnce`` (acks=all, retries, no idempotence, 5 in flight).
- ``idempotent``: ``AtLeastOnce(idempotent=True)`` (the same plus sequence numbers).
- ``transactional``: ``ExactlyOnce`` (a transactional.id); records committed every
  ``records_per_txn`` records or every ``commit_interval_ms`` milliseconds (Kafka Streams'
  commit.interval.ms idea).

Numbers depend on the machine: nothing here asserts a speed; it returns what it measured.
"""
from __future__ import annotations

import struct
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import pandas as pd
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from labkit import topics
from labkit.clientlog import client_config
from labkit.pipelines.guarantee import AtLeastOnce, AtMostOnce, ExactlyOnce, Guarantee

GUARANTEES: dict[str, Guarantee] = {
    "at_most_once": AtMostOnce(),
    "at_least_once": AtLeastOnce(),
    "idempotent": AtLeastOnce(idempotent=True),
    "transactional": ExactlyOnce(),
}
BENCH_TUNING = {"linger.ms": 5}
HEADER = struct.Struct(">qi")  # produce time (perf_counter_ns), sequence number
DEFAULT_COMMIT_INTERVAL_MS = 100.0  # the published benchmarks' setting (see notebook 09)
DRAIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Measurement:
    """One run: plain data, one DataFrame row."""

    guarantee: str
    records_per_txn: int | None
    commit_interval_ms: float | None
    records: int
    value_bytes: int
    rate: float | None  # records/s the producer was paced at (None: as fast as it can)
    transactions: int
    seconds: float  # first produce() to the last record acknowledged / committed
    records_per_s: float
    mb_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    delivered: int  # distinct records the read_committed consumer received
    duplicates: int


def _check(guarantee: str, records: int, value_bytes: int, records_per_txn: int | None,
           commit_interval_ms: float | None) -> None:
    if guarantee not in GUARANTEES:
        raise ValueError(f"unknown guarantee {guarantee!r}; choose one of {', '.join(GUARANTEES)}")
    if records < 1 or value_bytes < HEADER.size:
        raise ValueError(f"records must be >= 1 and value_bytes >= {HEADER.size} "
                         f"(got {records}, {value_bytes})")
    if not GUARANTEES[guarantee].transactional and (records_per_txn or commit_interval_ms):
        raise ValueError("records_per_txn / commit_interval_ms only apply to 'transactional'")
    if records_per_txn is not None and records_per_txn < 1:
        raise ValueError(f"records_per_txn must be >= 1, not {records_per_txn}")


class _Reader(threading.Thread):
    """A read_committed consumer that timestamps every record it is handed."""

    def __init__(self, bootstrap: str, topic: str, expected: int):
        super().__init__(name="labkit-bench-reader", daemon=True)
        self.expected = expected
        self.latencies_ns: list[int] = []
        self.seen: set[int] = set()
        self.duplicates = 0
        self.ready = threading.Event()
        self.stop_at: float | None = None  # monotonic deadline once the producer is done
        self.error: BaseException | None = None
        self.consumer = Consumer(client_config({
            "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "enable.partition.eof": True, "fetch.wait.max.ms": 10,
        }))
        topics.assign_all(self.consumer, topic)

    def run(self) -> None:
        try:
            while len(self.seen) < self.expected:
                if self.stop_at is not None and time.monotonic() > self.stop_at:
                    return
                for msg in self.consumer.consume(1000, timeout=0.05):
                    now = time.perf_counter_ns()
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            self.ready.set()
                        continue
                    sent, seq = HEADER.unpack_from(msg.value())
                    if seq < 0:  # the warm-up record
                        continue
                    if seq in self.seen:
                        self.duplicates += 1
                        continue
                    self.seen.add(seq)
                    self.latencies_ns.append(now - sent)
        except BaseException as exc:  # reported by measure(), in the caller's thread
            self.error = exc
        finally:
            self.ready.set()
            self.consumer.close()


def producer_config(bootstrap: str, guarantee: str) -> dict:
    """The measured producer's settings: the guarantee class's own, plus the bench tuning."""
    g = GUARANTEES[guarantee]
    txn_id = f"bench-{uuid.uuid4().hex[:12]}" if g.transactional else None
    return client_config({"bootstrap.servers": bootstrap, **BENCH_TUNING,
                          **g.producer_settings(txn_id)})


def _producer(bootstrap: str, guarantee: str) -> Producer:
    producer = Producer(producer_config(bootstrap, guarantee))
    if GUARANTEES[guarantee].transactional:
        producer.init_transactions(30)
    return producer


def _send(producer: Producer, topic: str, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value=value, partition=0)
            return
        except BufferError:  # the client's queue is full: let it drain a little
            producer.poll(0.005)


def measure(bootstrap: str, guarantee: str, records: int = 20_000, value_bytes: int = 1024,
            records_per_txn: int | None = None, commit_interval_ms: float | None = None,
            rate: float | None = None, topic: str | None = None,
            warmup: bool = True) -> Measurement:
    """Produce ``records`` values under ``guarantee`` and read them back; see the module doc.

    ``rate=None`` produces as fast as the client can (a throughput run: its latency is mostly
    queueing); a paced run (e.g. ``rate=1000`` records/s) measures latency below saturation.
    For ``transactional`` without either commit setting, commits every 100 ms. A fresh
    topic is made and deleted afterwards, unless ``topic`` names one to write to and keep.

    ``warmup`` first sends one untimed record (in its own transaction when transactional),
    so that connecting, fetching metadata and getting a producer id are not measured.
    """
    if rate is not None and rate <= 0:
        raise ValueError(f"rate must be > 0 records/s (or None), not {rate}")
    _check(guarantee, records, value_bytes, records_per_txn, commit_interval_ms)
    if GUARANTEES[guarantee].transactional and records_per_txn is None and commit_interval_ms is None:
        commit_interval_ms = DEFAULT_COMMIT_INTERVAL_MS
    keep = topic is not None
    topic = topic or f"bench-{guarantee.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    topics.create(bootstrap, topic)
    try:
        return _measure(bootstrap, topic, guarantee, records, value_bytes, records_per_txn,
                        commit_interval_ms, rate, warmup)
    finally:
        if not keep:
            _delete(bootstrap, topic)


def _measure(bootstrap: str, topic: str, guarantee: str, records: int, value_bytes: int,
             records_per_txn: int | None, commit_interval_ms: float | None,
             rate: float | None, warmup: bool) -> Measurement:
    reader = _Reader(bootstrap, topic, records)
    reader.start()
    reader.ready.wait(30)  # reading before the first record: latency excludes consumer start
    producer = _producer(bootstrap, guarantee)
    transactional = GUARANTEES[guarantee].transactional
    pad = b"x" * (value_bytes - HEADER.size)
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    if warmup:  # seq -1: the reader skips it
        if transactional:
            producer.begin_transaction()
        _send(producer, topic, HEADER.pack(time.perf_counter_ns(), -1) + pad)
        if transactional:
            producer.commit_transaction(30)
        producer.flush(30)
    transactions, in_txn = 0, 0
    interval_ns = int(commit_interval_ms * 1e6) if commit_interval_ms else None
    gap_ns = int(1e9 / rate) if rate else 0
    started = time.perf_counter_ns()
    txn_started = started
    if transactional:
        producer.begin_transaction()
    for seq in range(records):
        now = time.perf_counter_ns()
        while gap_ns and now < started + seq * gap_ns:  # paced: wait for this record's turn
            producer.poll((started + seq * gap_ns - now) / 1e9)  # returns early on events
            now = time.perf_counter_ns()
        if transactional and in_txn and (
                (records_per_txn and in_txn >= records_per_txn)
                or (interval_ns and now - txn_started >= interval_ns)):
            producer.commit_transaction(30)
            transactions += 1
            producer.begin_transaction()
            in_txn, txn_started = 0, time.perf_counter_ns()
            now = txn_started
        _send(producer, topic, HEADER.pack(now, seq) + pad)
        producer.poll(0)
        in_txn += 1
    if transactional:
        producer.commit_transaction(30)  # flushes, then commits
        transactions += 1
    left = producer.flush(30)
    seconds = (time.perf_counter_ns() - started) / 1e9
    reader.stop_at = time.monotonic() + DRAIN_TIMEOUT_S
    reader.join()
    if reader.error is not None:
        raise reader.error
    if left or (errors and GUARANTEES[guarantee].delivery_errors_fail):
        raise RuntimeError(f"{guarantee}: {left} record(s) undelivered, errors {errors[:3]}")
    lat = sorted(reader.latencies_ns) or [0]
    return Measurement(
        guarantee=guarantee, records_per_txn=records_per_txn,
        commit_interval_ms=commit_interval_ms, records=records, value_bytes=value_bytes,
        rate=rate, transactions=transactions, seconds=round(seconds, 4),
        records_per_s=round(records / seconds, 1),
        mb_per_s=round(records * value_bytes / seconds / 1e6, 2),
        latency_p50_ms=round(_percentile(lat, 50) / 1e6, 3),
        latency_p99_ms=round(_percentile(lat, 99) / 1e6, 3),
        delivered=len(reader.seen), duplicates=reader.duplicates)


def _percentile(sorted_values: list[int], pct: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(pct / 100 * (len(sorted_values) - 1))))
    return float(sorted_values[index])


def _delete(bootstrap: str, topic: str) -> None:
    """Benchmark topics hold megabytes: drop them once measured."""
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap}))
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        try:
            future.result(30)
        except Exception:  # best effort: a leftover topic only costs disk
            pass


def compare_guarantees(bootstrap: str, guarantees: tuple[str, ...] = tuple(GUARANTEES),
                       records: int = 20_000, value_bytes: int = 1024, repeats: int = 3,
                       commit_interval_ms: float = DEFAULT_COMMIT_INTERVAL_MS,
                       latency_rate: float = 1000.0, latency_records: int = 1000) -> pd.DataFrame:
    """Per guarantee and repeat: a throughput run (unpaced, ``records``) and a latency run
    (paced at ``latency_rate``); one row each, ``mode`` says which. Guarantees take turns
    (round-robin) so that noise from the rest of the machine hits all of them alike."""
    rows = []
    for repeat in range(repeats):
        for g in guarantees:
            interval = commit_interval_ms if GUARANTEES[g].transactional else None
            for mode, n, rate in (("throughput", records, None),
                                  ("latency", latency_records, latency_rate)):
                m = measure(bootstrap, g, n, value_bytes, commit_interval_ms=interval, rate=rate)
                rows.append({"mode": mode, "repeat": repeat, **asdict(m)})
    return pd.DataFrame(rows)


def commit_sweep(bootstrap: str, sizes: tuple[int, ...] = (1, 10, 100, 1000),
                 records: int | dict[int, int] = 5_000, value_bytes: int = 1024,
                 repeats: int = 3, latency_rate: float = 1000.0,
                 latency_records: int | dict[int, int] = 3000) -> pd.DataFrame:
    """Transactional runs with ``size`` records per transaction, in both modes (see
    ``compare_guarantees``). ``records`` and ``latency_records`` may be given per size: one
    record per transaction is slow, fewer records keep that run short."""
    def per_size(value: int | dict[int, int], size: int) -> int:
        return value[size] if isinstance(value, dict) else value

    rows = []
    for repeat in range(repeats):
        for size in sizes:
            for mode, count, rate in (("throughput", per_size(records, size), None),
                                      ("latency", per_size(latency_records, size), latency_rate)):
                m = measure(bootstrap, "transactional", count, value_bytes,
                            records_per_txn=size, rate=rate)
                rows.append({"mode": mode, "repeat": repeat, **asdict(m)})
    return pd.DataFrame(rows)


def summarize(runs: pd.DataFrame, by: str = "guarantee",
              baseline: str | int | None = "at_least_once") -> pd.DataFrame:
    """Medians per ``by``: throughput from the throughput runs, latency from the paced runs,
    throughput relative to ``baseline``, and whether every run delivered every record once."""
    fast, paced = runs[runs["mode"] == "throughput"], runs[runs["mode"] == "latency"]
    out = pd.DataFrame({
        "records_per_s": fast.groupby(by, sort=False)["records_per_s"].median(),
        "mb_per_s": fast.groupby(by, sort=False)["mb_per_s"].median(),
        "latency_p50_ms": paced.groupby(by, sort=False)["latency_p50_ms"].median(),
        "latency_p99_ms": paced.groupby(by, sort=False)["latency_p99_ms"].median(),
    })
    out["runs"] = runs.groupby(by, sort=False).size()
    complete = (runs["delivered"] == runs["records"]) & (runs["duplicates"] == 0)
    out["all_delivered"] = complete.groupby(runs[by], sort=False).all()
    if baseline is not None and baseline in out.index:
        base = out.loc[baseline, "records_per_s"]
        out["throughput_vs_baseline_pct"] = ((out["records_per_s"] / base - 1) * 100).round(1)
    return out
