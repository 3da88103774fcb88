"""What each delivery guarantee costs: producer throughput and end-to-end latency, measured.

    df = bench.compare_guarantees(bootstrap, records=20_000, repeats=7)   # one row per run
    table = bench.summarize(df)              # medians, spread, paired ratio vs at_least_once
    bench.conclude(table).lines()            # what this run's numbers say, derived from them
    grid = bench.commit_grid(bootstrap, value_sizes=(100, 1024), intervals_ms=(10, 100))
    bench.commit_sweep(bootstrap, sizes=(1, 10, 100, 1000))               # records per txn

Every run writes ``records`` values of ``value_bytes`` to a one-partition topic with a real
confluent-kafka producer, while a real consumer reads them back with read_committed. Each
value starts with the producer's clock at ``produce()`` and a sequence number, so the
consumer measures end-to-end latency (produce call to delivery to the application, buffering
and the wait for the transaction's commit included) and counts what arrived.

A ``Lane`` is one guarantee's topic, producer and reader, set up once (topic creation,
consumer start, ``init_transactions()`` and one warm-up record are not measured) and then
run many times. ``compare_guarantees`` and ``commit_grid`` open one lane per configuration
and let them take turns, round after round, in alternating order (ABCD DCBA ...), so the
noise of a shared machine hits every guarantee alike; each guarantee is then compared with
the baseline *within* a round (a paired ratio), and the spread of those ratios over the
rounds says whether a difference is larger than the noise.

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
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import pandas as pd
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

    def run(self) -> None:
        try:
            while not self.closing.is_set():
                if not self.reading.wait(0.05):
                    continue
                for msg in self.consumer.consume(1000, timeout=0.05):
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
        _check(self.guarantee, records, self.value_bytes, records_per_txn, commit_interval_ms, rate)
        if self.transactional and records_per_txn is None and commit_interval_ms is None:
            commit_interval_ms = DEFAULT_COMMIT_INTERVAL_MS
        producer, reader, topic = self.producer, self.reader, self.topic
        if reader.error is not None or not reader.is_alive():
            # A reader that stopped never says "done": waiting for it would only time out.
            raise reader.error or RuntimeError("the lane's reader has stopped")
        first = self.next_seq
        self.next_seq += records
        reader.expect(first, records)
        if rate is None:
            # A throughput run: the reader counts after the producer is done, so its Python
            # work does not compete with the producer's loop for the interpreter (the GIL).
            reader.reading.clear()
        pad = b"x" * (self.value_bytes - HEADER.size)
        errors: list[str] = []

        def on_delivery(err, _msg) -> None:
            if err is not None:
                errors.append(str(err))

        transactions, in_txn, commit_ns, flush_ns = 0, 0, 0, 0
        interval_ns = int(commit_interval_ms * 1e6) if commit_interval_ms else None
        gap_ns = int(1e9 / rate) if rate else 0

        def commit() -> None:
            # commit_transaction() flushes first; flushing explicitly splits the producer's
            # wait into the records' acknowledgements and the commit (EndTxn) itself
            nonlocal transactions, commit_ns, flush_ns
            t = time.perf_counter_ns()
            producer.flush(30)
            flushed = time.perf_counter_ns()
            producer.commit_transaction(30)
            commit_ns += time.perf_counter_ns() - t
            flush_ns += flushed - t
            transactions += 1

        try:
            started = time.perf_counter_ns()
            txn_started = started
            if self.transactional:
                producer.begin_transaction()
            for i in range(records):
                now = time.perf_counter_ns()
                while gap_ns and now < started + i * gap_ns:  # paced: wait for this record's turn
                    producer.poll((started + i * gap_ns - now) / 1e9)  # returns early on events
                    now = time.perf_counter_ns()
                if self.transactional and in_txn and (
                        (records_per_txn and in_txn >= records_per_txn)
                        or (interval_ns and now - txn_started >= interval_ns)):
                    commit()
                    producer.begin_transaction()
                    in_txn, txn_started = 0, time.perf_counter_ns()
                    now = txn_started
                _send(producer, topic, HEADER.pack(now, first + i) + pad, on_delivery)
                producer.poll(0)
                in_txn += 1
            if self.transactional:
                commit()
            left = producer.flush(30)
            seconds = (time.perf_counter_ns() - started) / 1e9
        finally:  # also when producing fails: a reader left holding off would never read again
            reader.reading.set()
        reader.done.wait(DRAIN_TIMEOUT_S)
        if reader.error is not None:
            raise reader.error
        if left or (errors and GUARANTEES[self.guarantee].delivery_errors_fail):
            raise RuntimeError(f"{self.guarantee}: {left} record(s) undelivered, errors {errors[:3]}")
        with reader.lock:
            # latency only means something when the reader read alongside (paced runs)
            lat = sorted(reader.latencies_ns) if rate is not None and reader.latencies_ns else None
            delivered, duplicates = len(reader.seen), reader.duplicates
        return Measurement(
            guarantee=self.guarantee, records_per_txn=records_per_txn,
            commit_interval_ms=commit_interval_ms, records=records,
            value_bytes=self.value_bytes, rate=rate, transactions=transactions,
            seconds=round(seconds, 4), records_per_s=round(records / seconds, 1),
            mb_per_s=round(records * self.value_bytes / seconds / 1e6, 2),
            latency_p50_ms=round(_percentile(lat, 50) / 1e6, 3) if lat else float("nan"),
            latency_p99_ms=round(_percentile(lat, 99) / 1e6, 3) if lat else float("nan"),
            delivered=delivered, duplicates=duplicates,
            commit_seconds=round(commit_ns / 1e9, 4), flush_seconds=round(flush_ns / 1e9, 4))


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


def _turns(keys: list, repeat: int) -> list:
    """Round ``repeat``'s order: forwards in even rounds, backwards in odd ones (ABCD DCBA),
    so no configuration always runs right after the same other one."""
    return keys if repeat % 2 == 0 else keys[::-1]


def compare_guarantees(bootstrap: str, guarantees: tuple[str, ...] = tuple(GUARANTEES),
                       records: int = 20_000, value_bytes: int = 1024, repeats: int = 3,
                       commit_interval_ms: float = DEFAULT_COMMIT_INTERVAL_MS,
                       latency_rate: float = 1000.0, latency_records: int = 1000,
                       latency_repeats: int | None = None) -> pd.DataFrame:
    """``repeats`` rounds of throughput runs (unpaced, ``records``), then ``latency_repeats``
    (default ``repeats``) rounds of latency runs (paced at ``latency_rate``); one row each,
    ``mode`` says which and ``repeat`` the round. In every round each guarantee takes its
    turn on its own lane, in alternating order."""
    latency_repeats = repeats if latency_repeats is None else latency_repeats
    rows = []
    with ExitStack() as stack:
        lanes = {g: stack.enter_context(Lane(bootstrap, g, value_bytes)) for g in guarantees}
        for mode, rounds, n, rate in (("throughput", repeats, records, None),
                                      ("latency", latency_repeats, latency_records, latency_rate)):
            for repeat in range(rounds):
                for g in _turns(list(guarantees), repeat):
                    interval = commit_interval_ms if GUARANTEES[g].transactional else None
                    m = lanes[g].run(n, commit_interval_ms=interval, rate=rate)
                    rows.append({"mode": mode, "repeat": repeat, **asdict(m)})
    return pd.DataFrame(rows)


def commit_grid(bootstrap: str, value_sizes: tuple[int, ...] = (100, 1024),
                intervals_ms: tuple[float, ...] = (10.0, 100.0),
                records: int | dict[int, int] = 20_000, repeats: int = 5) -> pd.DataFrame:
    """Throughput of transactional runs committing every ``interval`` ms, per value size,
    each beside an ``at_least_once`` run of the same size in the same round (the paired
    baseline). ``records`` may be given per value size. Rows as ``compare_guarantees``
    (mode "throughput"), plus ``config``: "at_least_once" or "transactional@<interval>ms"."""
    rows = []
    for size in value_sizes:  # one size's topics are gone before the next size's are made
        n = records[size] if isinstance(records, dict) else records
        with Lane(bootstrap, "at_least_once", size) as alo, \
                Lane(bootstrap, "transactional", size) as txn:
            configs = [("at_least_once", alo, None)] + [
                (f"transactional@{interval:g}ms", txn, interval) for interval in intervals_ms]
            for repeat in range(repeats):
                for config, lane, interval in _turns(configs, repeat):
                    m = lane.run(n, commit_interval_ms=interval)
                    rows.append({"mode": "throughput", "repeat": repeat, "config": config,
                                 **asdict(m)})
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
    with Lane(bootstrap, "transactional", value_bytes) as lane:
        for repeat in range(repeats):
            for size in _turns(list(sizes), repeat):
                for mode, count, rate in (("throughput", per_size(records, size), None),
                                          ("latency", per_size(latency_records, size), latency_rate)):
                    m = lane.run(count, records_per_txn=size, rate=rate)
                    rows.append({"mode": mode, "repeat": repeat, **asdict(m)})
    return pd.DataFrame(rows)


# ---- what the runs say: medians, spread, and a conclusion derived from them ----

PAIR_KEYS = ["repeat", "value_bytes"]  # a run's baseline: same round, same record size


def _vs_baseline_pct(fast: pd.DataFrame, by: str, baseline: str | int) -> pd.Series:
    """Each throughput run against its baseline's run of the same round and size, in %:
    pairing cancels what the rest of the machine did to that round."""
    base = fast[fast[by] == baseline].set_index(PAIR_KEYS)["records_per_s"]
    paired = base.reindex(pd.MultiIndex.from_frame(fast[PAIR_KEYS])).to_numpy()
    return pd.Series((fast["records_per_s"].to_numpy() / paired - 1) * 100, index=fast.index)


def summarize(runs: pd.DataFrame, by: str = "guarantee",
              baseline: str | int | None = "at_least_once") -> pd.DataFrame:
    """One row per ``by``: median throughput of the throughput runs with its range
    (``_min``/``_max``), median latency of the paced runs, whether every run delivered every
    record once, and (with a ``baseline``) the throughput relative to the baseline's run of
    the same round: median (``throughput_vs_baseline_pct``), the middle half of the rounds
    (``_q1``/``_q3``) and the range (``_min``/``_max``). For transactional runs also the
    median share of the run the producer waited in commit_transaction() and ms per commit."""
    fast, paced = runs[runs["mode"] == "throughput"], runs[runs["mode"] == "latency"]
    tput = fast.groupby(by, sort=False)["records_per_s"]
    out = pd.DataFrame({
        "records_per_s": tput.median(), "records_per_s_min": tput.min(),
        "records_per_s_max": tput.max(),
        "mb_per_s": fast.groupby(by, sort=False)["mb_per_s"].median(),
        "latency_p50_ms": paced.groupby(by, sort=False)["latency_p50_ms"].median(),
        "latency_p99_ms": paced.groupby(by, sort=False)["latency_p99_ms"].median(),
        "latency_p50_ms_min": paced.groupby(by, sort=False)["latency_p50_ms"].min(),
        "latency_p50_ms_max": paced.groupby(by, sort=False)["latency_p50_ms"].max(),
    }).reindex(list(dict.fromkeys(runs[by])))  # in the order the runs came, not sorted
    out["runs"] = runs.groupby(by, sort=False).size()
    complete = (runs["delivered"] == runs["records"]) & (runs["duplicates"] == 0)
    out["all_delivered"] = complete.groupby(runs[by], sort=False).all()
    if baseline is not None and baseline in out.index:
        pct = _vs_baseline_pct(fast, by, baseline).groupby(fast[by], sort=False)
        out["throughput_vs_baseline_pct"] = pct.median().round(1)
        out["vs_baseline_pct_q1"] = pct.quantile(0.25).round(1)
        out["vs_baseline_pct_q3"] = pct.quantile(0.75).round(1)
        out["vs_baseline_pct_min"] = pct.min().round(1)
        out["vs_baseline_pct_max"] = pct.max().round(1)
    if "commit_seconds" in fast and (fast["transactions"] > 0).any():
        txn = fast[fast["transactions"] > 0]
        share = (txn["commit_seconds"] / txn["seconds"] * 100).groupby(txn[by], sort=False)
        per_commit = (txn["commit_seconds"] / txn["transactions"] * 1000).groupby(txn[by], sort=False)
        flushing = (txn["flush_seconds"] / txn["transactions"] * 1000).groupby(txn[by], sort=False)
        out["commit_wait_pct"] = share.median().round(1)
        out["ms_per_commit"] = per_commit.median().round(1)
        out["flush_ms_per_commit"] = flushing.median().round(1)
    return out


def summarize_grid(grid: pd.DataFrame) -> pd.DataFrame:
    """``commit_grid``'s runs: one row per (value_bytes, config), as ``summarize`` with the
    same-size ``at_least_once`` run of each round as the baseline."""
    parts = {size: summarize(runs, by="config", baseline="at_least_once")
             for size, runs in grid.groupby("value_bytes", sort=True)}
    return pd.concat(parts, names=["value_bytes", "config"])


def difference(q1_pct: float, q3_pct: float) -> str:
    """"slower" / "faster" when the middle half of the paired rounds lies wholly below /
    above the baseline, else "no difference beyond the spread"."""
    if q3_pct < 0:
        return "slower"
    if q1_pct > 0:
        return "faster"
    return "no difference beyond the spread"


@dataclass(frozen=True)
class Conclusion:
    """What one ``summarize`` table says, every field derived from the table's numbers."""

    baseline: str
    fastest: str
    fastest_records_per_s: float
    runner_up: str
    fastest_clear: bool  # the fastest's middle half of rounds above the runner-up's
    compared: dict[str, tuple[float, float, float, str]]  # name -> median %, q1, q3, verdict
    slowest_to_read: str | None  # highest median p50 latency of the paced runs
    slowest_to_read_p50_ms: float | None
    slowest_to_read_clear: bool  # its fastest paced run slower than every other's slowest

    def verdict(self, name: str) -> str:
        """"slower" / "faster" / "no difference beyond the spread" for ``name``."""
        return self.compared[name][3]

    def headline(self, exactly_once: str = "transactional") -> str:
        """What exactly-once cost in this run, in one sentence derived from the numbers."""
        median, q1, q3, verdict = self.compared[exactly_once]
        if verdict == "slower":
            cost = (f"had {-median:.0f} % less throughput than {self.baseline} (the middle half "
                    f"of the rounds: {-q3:.0f} to {-q1:.0f} % less)")
        elif verdict == "faster":  # noise can do this: the appendix shows the rounds
            cost = (f"ran {median:.0f} % faster than {self.baseline} (middle half of the rounds "
                    f"{q1:+.0f} to {q3:+.0f} %): the rounds disagree with the usual cost, see the appendix")
        else:
            cost = (f"showed no throughput difference from {self.baseline} beyond the spread of "
                    f"the rounds ({q1:+.0f} to {q3:+.0f} %)")
        if self.slowest_to_read == exactly_once:
            wait = (f"and a read_committed reader waited longest for its records (median "
                    f"{self.slowest_to_read_p50_ms:.0f} ms: a record is readable once its "
                    "transaction commits)")
        elif self.slowest_to_read is not None:
            wait = f"and a read_committed reader waited longest for {self.slowest_to_read}, not for it"
        else:
            wait = "(no latency measured)"
        return f"In this run, exactly-once ({exactly_once}) {cost}, {wait}."

    def lines(self) -> list[str]:
        out = [f"fastest: {self.fastest} (median {self.fastest_records_per_s:,.0f} records/s), "
               f"ahead of {self.runner_up} beyond the spread: "
               f"{'yes' if self.fastest_clear else 'no'}"]
        for name, (median, q1, q3, verdict) in self.compared.items():
            out.append(f"{name} vs {self.baseline}: {median:+.1f} % throughput "
                       f"(middle half of the rounds {q1:+.1f} to {q3:+.1f} %): {verdict}")
        if self.slowest_to_read is not None:
            out.append(f"longest wait for a read_committed reader: {self.slowest_to_read} "
                       f"(median p50 {self.slowest_to_read_p50_ms:.0f} ms), longer than every "
                       f"other guarantee in every round: {'yes' if self.slowest_to_read_clear else 'no'}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def conclude(summary: pd.DataFrame, baseline: str = "at_least_once") -> Conclusion:
    """The conclusion of a ``summarize`` table (with ``baseline``): which guarantee was
    fastest (median throughput), whether it was ahead of the next beyond the spread (its
    lower quartile vs the baseline above the next one's upper quartile), and for every other
    guarantee whether it was slower / faster than the baseline beyond the spread."""
    needed = {"records_per_s", "throughput_vs_baseline_pct", "vs_baseline_pct_q1",
              "vs_baseline_pct_q3"}
    if missing := needed - set(summary.columns):
        raise ValueError(f"conclude() needs a summarize() table with a baseline; missing {sorted(missing)}")
    if baseline not in summary.index or len(summary) < 2:
        raise ValueError(f"conclude() needs the baseline {baseline!r} and one more row; "
                         f"the table has {list(summary.index)}")
    ranked = summary.sort_values("records_per_s", ascending=False)
    fastest, runner_up = ranked.index[0], ranked.index[1]
    compared = {
        name: (float(row.throughput_vs_baseline_pct), float(row.vs_baseline_pct_q1),
               float(row.vs_baseline_pct_q3),
               difference(row.vs_baseline_pct_q1, row.vs_baseline_pct_q3))
        for name, row in summary.iterrows() if name != baseline}
    slowest, slowest_p50, slowest_clear = None, None, False
    if {"latency_p50_ms", "latency_p50_ms_min", "latency_p50_ms_max"} <= set(summary.columns) \
            and summary["latency_p50_ms"].notna().all():
        slowest = summary["latency_p50_ms"].idxmax()
        slowest_p50 = float(summary.loc[slowest, "latency_p50_ms"])
        others = summary.drop(index=slowest)
        slowest_clear = bool(summary.loc[slowest, "latency_p50_ms_min"] > others["latency_p50_ms_max"].max())
    return Conclusion(
        baseline=baseline, fastest=str(fastest),
        fastest_records_per_s=float(ranked["records_per_s"].iloc[0]), runner_up=str(runner_up),
        fastest_clear=bool(ranked["vs_baseline_pct_q1"].iloc[0] > ranked["vs_baseline_pct_q3"].iloc[1]),
        compared=compared, slowest_to_read=None if slowest is None else str(slowest),
        slowest_to_read_p50_ms=slowest_p50, slowest_to_read_clear=slowest_clear)


# What Kafka's authors published (notebook 09 sets these beside the measured grid).
@dataclass(frozen=True)
class Published:
    source: str
    setting: str
    versus: str  # what the cost was measured against
    low_pct: float  # the throughput change published, as a range (low == high: one figure)
    high_pct: float
    value_bytes: int | None  # the measured cell it is set beside
    commit_interval_ms: float | None
    baseline: str  # the lab's guarantee standing in for ``versus``

    def figure_text(self) -> str:
        """The published figure as printed: one value, or its range."""
        if self.low_pct == self.high_pct:
            return f"{self.low_pct:+.0f} %"
        return f"{self.low_pct:+.0f} to {self.high_pct:+.0f} %"


PUBLISHED = (
    Published("Confluent blog, Transactions in Apache Kafka (Mehta, Gustafson 2017)",
              "producer, 1 KB records, commit every 100 ms",
              "at-least-once, in order (acks=all, 1 in flight)", -3.0, -3.0, 1024, 100.0,
              "at_least_once"),
    Published("Confluent blog, Exactly-once Semantics Are Possible (Narkhede 2017)",
              "producer, 1 KB records, transactions of 100 ms",
              "at-most-once (acks=1, 5 in flight)", -20.0, -20.0, 1024, 100.0, "at_most_once"),
    Published("Kafka Streams exactly-once, as Confluent published it",
              "Streams app, commit.interval.ms=100", "at-least-once Streams",
              -30.0, -15.0, None, 100.0, "at_least_once"),
)


def _measured_cell(pub: Published, grid_table: pd.DataFrame,
                   versus_at_most_once: pd.DataFrame | None) -> tuple[pd.Series, str] | None:
    """The measured row a published figure is set beside, and how to name it."""
    if pub.baseline == "at_most_once":
        if versus_at_most_once is None:
            return None
        return versus_at_most_once.loc["transactional"], "transactional vs at_most_once (section 2)"
    key = f"transactional@{pub.commit_interval_ms:g}ms"
    sizes = sorted(grid_table.index.get_level_values("value_bytes").unique())
    size = pub.value_bytes if pub.value_bytes in sizes else max(sizes)  # Streams: no size given
    return grid_table.loc[(size, key)], f"{key}, {size} B records"


def _placement(pub: Published, q1: float, q3: float) -> str:
    if pub.high_pct < q1:
        return "published cost larger than measured"
    if pub.low_pct > q3:
        return "published cost smaller than measured"
    return "within the spread"


def beside_published(grid_table: pd.DataFrame, versus_at_most_once: pd.DataFrame | None = None,
                     published: tuple[Published, ...] = PUBLISHED) -> pd.DataFrame:
    """Each published figure beside the measured cell it describes: the median throughput
    change of the paired rounds, their middle half, and whether the published figure lies
    inside that middle half ("within the spread") or outside it, and on which side.

    ``grid_table`` is ``summarize_grid``'s; the figure against at-most-once needs
    ``versus_at_most_once``, a ``summarize(runs, baseline="at_most_once")`` table."""
    rows = []
    for pub in published:
        found = _measured_cell(pub, grid_table, versus_at_most_once)
        if found is None:
            continue
        cell, measured_at = found
        q1, q3 = float(cell["vs_baseline_pct_q1"]), float(cell["vs_baseline_pct_q3"])
        rows.append({"published": pub.figure_text(),
                     "setting": pub.setting, "versus": pub.versus, "source": pub.source,
                     "measured here": measured_at,
                     "measured_pct": float(cell["throughput_vs_baseline_pct"]),
                     "middle_half_pct": f"{q1:+.1f} to {q3:+.1f}",
                     "comparison": _placement(pub, q1, q3)})
    return pd.DataFrame(rows)


def explain(grid_table: pd.DataFrame, summary: pd.DataFrame,
            versus_at_most_once: pd.DataFrame | None = None,
            published: tuple[Published, ...] = PUBLISHED) -> list[str]:
    """Why each published figure and this run differ, in sentences made from this run's
    numbers: for a figure against at-least-once, how long a commit held the producer here
    versus what the published cost leaves per commit; for the one against at-most-once,
    whether at_most_once was faster than at_least_once here at all (``summary`` is
    ``summarize(runs)``, baseline at_least_once)."""
    lines = []
    for pub in published:
        found = _measured_cell(pub, grid_table, versus_at_most_once)
        if found is None:
            continue
        cell, measured_at = found
        q1, q3 = float(cell["vs_baseline_pct_q1"]), float(cell["vs_baseline_pct_q3"])
        placement = _placement(pub, q1, q3)
        published_text = pub.figure_text()
        head = f"{pub.source}: published {published_text}, measured {measured_at} " \
               f"{float(cell['throughput_vs_baseline_pct']):+.1f} %: {placement}"
        if placement == "within the spread":
            lines.append(head + ".")
        elif pub.baseline == "at_least_once":
            # a commit stalls the producer for w ms every interval i: cost ~ w / (i + w)
            interval = pub.commit_interval_ms or DEFAULT_COMMIT_INTERVAL_MS
            implied = [-p / 100 * interval / (1 + p / 100) for p in (pub.high_pct, pub.low_pct)]
            implied_text = f"{implied[0]:.0f}" if pub.low_pct == pub.high_pct \
                else f"{implied[0]:.0f}-{implied[1]:.0f}"
            lines.append(head + f"; here each commit held the producer {cell['ms_per_commit']:.0f} ms "
                         f"(median; {cell['commit_wait_pct']:.0f} % of the run), "
                         f"{cell['flush_ms_per_commit']:.0f} ms of it waiting for the "
                         "transaction's records to be acknowledged and "
                         f"{cell['ms_per_commit'] - cell['flush_ms_per_commit']:.0f} ms in the "
                         f"commit itself; a {published_text} cost at a {interval:g} ms interval "
                         f"leaves about {implied_text} ms per commit.")
        else:
            amo = summary.loc["at_most_once"]
            verdict = difference(amo["vs_baseline_pct_q1"], amo["vs_baseline_pct_q3"])
            lines.append(head + f"; here at_most_once (acks=0) vs at_least_once: "
                         f"{float(amo['throughput_vs_baseline_pct']):+.1f} %, {verdict}"
                         + (": fire-and-forget bought no throughput on this machine, so "
                            "there was no such gap for transactions to lose." if verdict != "faster"
                            else "."))
    return lines


def commit_wait_falls_with_interval(grid_table: pd.DataFrame) -> bool:
    """Whether, at every record size of a ``summarize_grid`` table, the producer waited in
    commit_transaction() for a smaller share of the run the longer its commit interval."""
    for _, cells in grid_table.groupby(level="value_bytes"):
        txn = cells[cells["commit_wait_pct"].notna()].droplevel("value_bytes")
        by_interval = sorted((float(config.split("@")[1].removesuffix("ms")), wait)
                             for config, wait in txn["commit_wait_pct"].items())
        waits = [wait for _, wait in by_interval]
        if len(waits) < 2 or any(a <= b for a, b in zip(waits, waits[1:])):
            return False
    return True
