"""One guarantee's lane: its topic, its producer and its reader, set up once and then run many
times, each run one ``Measurement`` (producer throughput, end-to-end latency, what arrived).

Every run writes ``records`` values of ``value_bytes`` to a one-partition topic with a real
confluent-kafka producer, while a real consumer reads them back with read_committed. Each
value starts with the producer's clock at ``produce()`` and a sequence number, so the
consumer measures end-to-end latency (produce call to delivery to the application, buffering
and the wait for the transaction's commit included) and counts what arrived. Setting a lane
up (topic creation, consumer start, ``init_transactions()`` and one warm-up record) is not
measured.

The measured configurations are the guarantee classes' own producer settings
(``labkit.pipelines.guarantee``, the ones the pipelines of notebooks 01-07 run), with
linger.ms=5 instead of the pipelines' 50 (which only keeps crash experiments repeatable):

- ``at_most_once``: ``AtMostOnce`` (acks=0, no retries, no idempotence: fire and forget).
- ``at_least_once``: ``AtLeastOnce`` (acks=all, retries, no idempotence, 5 in flight).
- ``idempotent``: ``AtLeastOnce(idempotent=True)`` (the same plus sequence numbers).
- ``transactional``: ``ExactlyOnce`` (a transactional.id); records committed every
  ``records_per_txn`` records or every ``commit_interval_ms`` milliseconds (Kafka Streams'
  commit.interval.ms idea), and once at the end of the run.

Numbers depend on the machine: nothing here asserts a speed; it returns what it measured.
"""
from __future__ import annotations

import struct
import threading
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from labkit.kafka import names, topics
from labkit.kafka.clientlog import client_config
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
SEND_WAIT_S = 60.0  # a queue still full after this long: the broker is not taking records


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
    latency_p50_ms: float  # paced runs only (NaN for a throughput run)
    latency_p99_ms: float
    delivered: int  # distinct records the read_committed consumer received
    duplicates: int
    commit_seconds: float  # of ``seconds``, spent committing (0 if none), of which
    flush_seconds: float  # waiting for the transaction's records to be acknowledged


def _check(guarantee: str, records: int, value_bytes: int, records_per_txn: int | None,
           commit_interval_ms: float | None, rate: float | None = None) -> None:
    if guarantee not in GUARANTEES:
        raise ValueError(f"unknown guarantee {guarantee!r}; choose one of {', '.join(GUARANTEES)}")
    if records < 1 or value_bytes < HEADER.size:
        raise ValueError(f"records must be >= 1 and value_bytes >= {HEADER.size} "
                         f"(got {records}, {value_bytes})")
    if not GUARANTEES[guarantee].transactional and (records_per_txn or commit_interval_ms):
        raise ValueError("records_per_txn / commit_interval_ms only apply to 'transactional'")
    if records_per_txn is not None and records_per_txn < 1:
        raise ValueError(f"records_per_txn must be >= 1, not {records_per_txn}")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate must be > 0 records/s (or None), not {rate}")


class _Reader(threading.Thread):
    """A read_committed consumer that timestamps every record it is handed. It stays up for
    all the runs of a lane; ``expect`` says which sequence numbers the next run sends."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(name="labkit-bench-reader", daemon=True)
        self.lock = threading.Lock()
        self.first, self.count = 0, 0
        self.latencies_ns: list[int] = []
        self.seen: set[int] = set()
        self.duplicates = 0
        self.ready = threading.Event()  # at the partition's end once: reading has started
        self.done = threading.Event()  # every expected record of this run received
        self.closing = threading.Event()
        self.reading = threading.Event()  # cleared: hold off (a throughput run is producing)
        self.reading.set()
        self.error: BaseException | None = None
        self.consumer = Consumer(client_config({
            "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "enable.partition.eof": True, "fetch.wait.max.ms": 10,
            # Records gone from under the reader (deleted, out of range) are an error to
            # report, not a silent jump to the end that would undercount ``delivered``.
            "auto.offset.reset": "error",
        }))
        topics.assign_all(self.consumer, topic)

    def expect(self, first: int, count: int) -> None:
        with self.lock:
            self.first, self.count = first, count
            self.latencies_ns, self.seen, self.duplicates = [], set(), 0
            self.done.clear()

    def _arrived(self) -> list:
        """The records the client holds now, or else the first to arrive within 50 ms.
        consume(n, timeout) waits out its whole timeout unless n records come, which added
        0-50 ms to every record's latency, as much as a 100 ms transaction adds: enough, on
        a loaded CI machine, for a non-transactional lane to look slower than it."""
        batch = self.consumer.consume(1000, timeout=0)
        if batch:
            return batch
        first = self.consumer.poll(0.05)
        return [] if first is None else [first]

    def run(self) -> None:
        try:
            while not self.closing.is_set():
                if not self.reading.wait(0.05):
                    continue
                for msg in self._arrived():
                    now = time.perf_counter_ns()
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            self.ready.set()
                        elif not _transient(err):
                            # Before, every error was skipped and the loop went on for as long
                            # as the lane stayed open, reading nothing; the run then waited
                            # out its drain timeout and reported fewer records, silently.
                            raise KafkaException(err)
                        continue
                    sent, seq = HEADER.unpack_from(msg.value())
                    with self.lock:
                        if not self.first <= seq < self.first + self.count:
                            continue  # a warm-up record, or a late one of an earlier run
                        if seq in self.seen:
                            self.duplicates += 1
                            continue
                        self.seen.add(seq)
                        self.latencies_ns.append(now - sent)
                        if len(self.seen) == self.count:
                            self.done.set()
        except BaseException as exc:  # reported by Lane.run(), in the caller's thread
            self.error = exc
        finally:
            self.ready.set()
            self.done.set()
            self.consumer.close()


# Errors the client retries by itself (a connection dropped, a broker restarting): reading
# goes on. Anything else (an offset reset refused, authorization) ends the reader.
_RECONNECTING = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)


def _transient(err: KafkaError) -> bool:
    return not err.fatal() and (err.retriable() or err.code() in _RECONNECTING)


def producer_config(bootstrap: str, guarantee: str) -> dict:
    """The measured producer's settings: the guarantee class's own, plus the bench tuning."""
    g = GUARANTEES[guarantee]
    txn_id = f"bench-{uuid.uuid4().hex[:12]}" if g.transactional else None
    return client_config({"bootstrap.servers": bootstrap, **BENCH_TUNING,
                          **g.producer_settings(txn_id)})


def _send(producer: Producer, topic: str, value: bytes, on_delivery=None) -> None:
    """produce(), waiting while the client's queue is full (at most SEND_WAIT_S: then the
    BufferError is raised)."""
    deadline = None  # set at the first full queue: no clock read per record otherwise
    while True:
        try:
            producer.produce(topic, value=value, partition=0, on_delivery=on_delivery)
            return
        except BufferError:  # the client's queue is full: let it drain a little
            deadline = deadline or time.monotonic() + SEND_WAIT_S
            if time.monotonic() > deadline:
                raise
            producer.poll(0.005)


class Lane:
    """One guarantee's topic, producer and read_committed reader, for many runs.

    Use it as a context manager: the reader thread is stopped, the producer flushed and the
    topic (unless ``topic`` named one to keep) deleted on the way out, also on errors.
    """

    def __init__(self, bootstrap: str, guarantee: str, value_bytes: int = 1024,
                 topic: str | None = None, warmup: bool = True):
        _check(guarantee, 1, value_bytes, None, None)
        self.bootstrap, self.guarantee, self.value_bytes = bootstrap, guarantee, value_bytes
        self.transactional = GUARANTEES[guarantee].transactional
        self.keep = topic is not None
        # in the learner's namespace (labkit.kafka.names): the producer below writes to this name
        self.topic = names.topic(topic or f"bench-{guarantee.replace('_', '-')}-{uuid.uuid4().hex[:8]}")
        self.warmup = warmup
        self.next_seq = 0
        self.reader: _Reader | None = None
        self.producer: Producer | None = None

    def __enter__(self) -> Lane:
        topics.create(self.bootstrap, self.topic)
        try:
            self.reader = _Reader(self.bootstrap, self.topic)
            self.reader.start()
            self.reader.ready.wait(30)  # reading before the first record: latency excludes it
            if self.reader.error is not None:
                raise self.reader.error
            self.producer = Producer(producer_config(self.bootstrap, self.guarantee))
            if self.transactional:
                self.producer.init_transactions(30)
            if self.warmup:  # connecting, metadata and the producer id are not measured
                self._warm_up()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.reader is not None:
            self.reader.closing.set()
            self.reader.join(10)
        if self.producer is not None:
            self.producer.flush(10)
        if not self.keep:
            _delete(self.bootstrap, self.topic)

    def new_run(self, records: int, records_per_txn: int | None,
                commit_interval_ms: float | None, rate: float | None) -> "_Run":
        """One run's state on this lane (a LoopLane's runs are the learner's loop)."""
        return _Run(self, records, records_per_txn, commit_interval_ms, rate)

    def _warm_up(self) -> None:
        pad = b"x" * (self.value_bytes - HEADER.size)
        if self.transactional:
            self.producer.begin_transaction()
        _send(self.producer, self.topic, HEADER.pack(time.perf_counter_ns(), -1) + pad)
        if self.transactional:
            self.producer.commit_transaction(30)
        self.producer.flush(30)

    def run(self, records: int, records_per_txn: int | None = None,
            commit_interval_ms: float | None = None, rate: float | None = None) -> Measurement:
        """Produce ``records`` values and wait until the reader has them (or 30 s passed).

        ``rate=None`` produces as fast as the client can (a throughput run: its latency is
        mostly queueing); a paced run (e.g. ``rate=1000`` records/s) measures latency below
        saturation. Transactional without either commit setting commits every 100 ms.
        """
        return run_side_by_side([(self, records_per_txn, commit_interval_ms)], records, rate)[0]


def run_side_by_side(runs: list[tuple[Lane, int | None, float | None]], records: int,
                     rate: float | None) -> list[Measurement]:
    """One run on each lane (``(lane, records_per_txn, commit_interval_ms)``), the lanes
    taking turns record by record: a pause of the machine (another process on the cores, a
    broker's garbage collection) then delays every lane's records alike, where lanes run one
    after another would each meet a different moment. Paced runs only when more than one."""
    if len(runs) > 1 and rate is None:
        raise ValueError("lanes run side by side only when paced (give a rate)")
    active = [lane.new_run(records, per_txn, interval, rate) for lane, per_txn, interval in runs]
    try:
        gap_ns = int(1e9 / rate) if rate else 0
        started = time.perf_counter_ns()
        for run in active:
            run.begin(started)
        for i in range(records):
            now = time.perf_counter_ns()
            while gap_ns and now < started + i * gap_ns:  # paced: wait for this record's turn
                share = (started + i * gap_ns - now) / 1e9 / len(active)
                for run in active:  # serve each producer's events; poll returns early on one
                    run.producer.poll(share)
                now = time.perf_counter_ns()
            for run in active:
                run.send(i)
        for run in active:
            run.end_producing()
    finally:  # also when producing fails: a reader left holding off would never read again
        for run in active:
            run.lane.reader.reading.set()
    return [run.measurement() for run in active]


class _Run:
    """One run's state on one lane: what it sent, its transactions, the time they took."""

    def __init__(self, lane: Lane, records: int, records_per_txn: int | None,
                 commit_interval_ms: float | None, rate: float | None):
        _check(lane.guarantee, records, lane.value_bytes, records_per_txn, commit_interval_ms, rate)
        if lane.transactional and records_per_txn is None and commit_interval_ms is None:
            commit_interval_ms = DEFAULT_COMMIT_INTERVAL_MS
        reader = lane.reader
        if reader.error is not None or not reader.is_alive():
            # A reader that stopped never says "done": waiting for it would only time out.
            raise reader.error or RuntimeError("the lane's reader has stopped")
        self.lane, self.producer, self.records, self.rate = lane, lane.producer, records, rate
        self.records_per_txn, self.commit_interval_ms = records_per_txn, commit_interval_ms
        self.first = lane.next_seq
        lane.next_seq += records
        reader.expect(self.first, records)
        if rate is None:
            # A throughput run: the reader counts after the producer is done, so its Python
            # work does not compete with the producer's loop for the interpreter (the GIL).
            reader.reading.clear()
        self.pad = b"x" * (lane.value_bytes - HEADER.size)
        self.errors: list[str] = []
        self.transactions, self.in_txn, self.commit_ns, self.flush_ns = 0, 0, 0, 0
        self.interval_ns = int(commit_interval_ms * 1e6) if commit_interval_ms else None
        self.started = self.txn_started = 0
        self.left, self.seconds = 0, 0.0

    def _on_delivery(self, err, _msg) -> None:
        if err is not None:
            self.errors.append(str(err))

    def begin(self, started: int) -> None:
        self.started = self.txn_started = started
        if self.lane.transactional:
            self.producer.begin_transaction()

    def _commit(self) -> None:
        # commit_transaction() flushes first; flushing explicitly splits the producer's
        # wait into the records' acknowledgements and the commit (EndTxn) itself
        t = time.perf_counter_ns()
        self.producer.flush(30)
        flushed = time.perf_counter_ns()
        self.producer.commit_transaction(30)
        self.commit_ns += time.perf_counter_ns() - t
        self.flush_ns += flushed - t
        self.transactions += 1

    def send(self, i: int) -> None:
        now = time.perf_counter_ns()
        if self.lane.transactional and self.in_txn and (
                (self.records_per_txn and self.in_txn >= self.records_per_txn)
                or (self.interval_ns and now - self.txn_started >= self.interval_ns)):
            self._commit()
            self.producer.begin_transaction()
            self.in_txn, self.txn_started = 0, time.perf_counter_ns()
            now = self.txn_started
        _send(self.producer, self.lane.topic, HEADER.pack(now, self.first + i) + self.pad,
              self._on_delivery)
        self.producer.poll(0)
        self.in_txn += 1

    def end_producing(self) -> None:
        if self.lane.transactional:
            self._commit()
        self.left = self.producer.flush(30)
        self.seconds = (time.perf_counter_ns() - self.started) / 1e9

    def measurement(self) -> Measurement:
        """Wait until the reader has every record (or 30 s passed), then the run's numbers."""
        lane, reader, records = self.lane, self.lane.reader, self.records
        reader.done.wait(DRAIN_TIMEOUT_S)
        if reader.error is not None:
            raise reader.error
        if self.left or (self.errors and GUARANTEES[lane.guarantee].delivery_errors_fail):
            raise RuntimeError(f"{lane.guarantee}: {self.left} record(s) undelivered, "
                               f"errors {self.errors[:3]}")
        with reader.lock:
            # latency only means something when the reader read alongside (paced runs)
            lat = sorted(reader.latencies_ns) if self.rate is not None and reader.latencies_ns else None
            delivered, duplicates = len(reader.seen), reader.duplicates
        seconds = self.seconds
        return Measurement(
            guarantee=lane.guarantee, records_per_txn=self.records_per_txn,
            commit_interval_ms=self.commit_interval_ms, records=records,
            value_bytes=lane.value_bytes, rate=self.rate, transactions=self.transactions,
            seconds=round(seconds, 4), records_per_s=round(records / seconds, 1),
            mb_per_s=round(records * lane.value_bytes / seconds / 1e6, 2),
            latency_p50_ms=round(_percentile(lat, 50) / 1e6, 3) if lat else float("nan"),
            latency_p99_ms=round(_percentile(lat, 99) / 1e6, 3) if lat else float("nan"),
            delivered=delivered, duplicates=duplicates,
            commit_seconds=round(self.commit_ns / 1e9, 4),
            flush_seconds=round(self.flush_ns / 1e9, 4))


def measure(bootstrap: str, guarantee: str, records: int = 20_000, value_bytes: int = 1024,
            records_per_txn: int | None = None, commit_interval_ms: float | None = None,
            rate: float | None = None, topic: str | None = None,
            warmup: bool = True) -> Measurement:
    """One run on a lane of its own (see ``Lane.run``). A fresh topic is made and deleted
    afterwards, unless ``topic`` names one to write to and keep. ``warmup`` first sends one
    untimed record (in its own transaction when transactional)."""
    _check(guarantee, records, value_bytes, records_per_txn, commit_interval_ms, rate)
    with Lane(bootstrap, guarantee, value_bytes, topic=topic, warmup=warmup) as lane:
        return lane.run(records, records_per_txn, commit_interval_ms, rate)


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
