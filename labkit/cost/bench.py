"""What each delivery guarantee costs: producer throughput and end-to-end latency, measured
in rounds.

    df = bench.compare_guarantees(bootstrap, records=20_000, repeats=7)   # one row per run
    table = findings.summarize(df)           # medians, spread, paired ratio vs at_least_once
    findings.conclude(table).lines()         # what this run's numbers say, derived from them
    grid = bench.commit_grid(bootstrap, value_sizes=(100, 1024), intervals_ms=(10, 100))
    wire = bench.wire_grid(bootstrap, value_sizes=(100, 1024), intervals_ms=(10, 100))
    bench.commit_sweep(bootstrap, sizes=(1, 10, 100, 1000))               # records per txn

Each run is one ``Measurement`` on a ``Lane`` (``labkit.cost.lane``: one guarantee's
topic, producer and reader, set up once). ``compare_guarantees`` and ``commit_grid`` open one
lane per configuration and let them take turns, round after round, in alternating order
(ABCD DCBA ...), so the noise of a shared machine hits every guarantee alike (paced latency
runs go side by side, taking turns record by record); each guarantee
is then compared with the baseline *within* a round (a paired ratio,
``labkit.cost.findings``), and the spread of those ratios over the rounds says
whether a difference is larger than the noise. ``labkit.cost.published`` sets the
published figures beside them. Every throughput run also records the CPU milliseconds the
client process and the broker spent on it (``cost_units.CpuClock``), and ``wire_grid``
counts through the fault proxy the requests and bytes each configuration exchanged: units a
shared machine's load does not blur the way it blurs wall time.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict

import pandas as pd

from labkit.cost.cost_units import CpuClock, wire_delta
from labkit.cost.lane import (DEFAULT_COMMIT_INTERVAL_MS, GUARANTEES, Lane,
                              run_side_by_side)
from labkit.cost.loop_run import LoopLane
from labkit.faults.proxy import FaultProxy


def _turns(keys: list, repeat: int) -> list:
    """Round ``repeat``'s order: forwards in even rounds, backwards in odd ones (ABCD DCBA),
    so no configuration always runs right after the same other one."""
    return keys if repeat % 2 == 0 else keys[::-1]


def _lane(bootstrap: str, guarantee: str, value_bytes: int, loop: Callable | None) -> Lane:
    """The guarantee's lane; the transactional one runs ``loop`` when given (the learner's)."""
    if loop is not None and GUARANTEES[guarantee].transactional:
        return LoopLane(bootstrap, loop, value_bytes)
    return Lane(bootstrap, guarantee, value_bytes)


def _timed(clock: CpuClock, lane: Lane, records: int, interval: float | None) -> dict:
    """One throughput run on ``lane`` as a row, with the CPU ms the client process and the
    broker spent on it (producing, then the reader catching up)."""
    start = clock.read()
    m = lane.run(records, commit_interval_ms=interval)
    client_ms, broker_ms = clock.since(start)
    return {**asdict(m), "client_cpu_ms": client_ms, "broker_cpu_ms": broker_ms}


def compare_guarantees(bootstrap: str, guarantees: tuple[str, ...] = tuple(GUARANTEES),
                       records: int = 20_000, value_bytes: int = 1024, repeats: int = 3,
                       commit_interval_ms: float = DEFAULT_COMMIT_INTERVAL_MS,
                       latency_rate: float = 1000.0, latency_records: int = 1000,
                       latency_repeats: int | None = None,
                       transactional_loop: Callable | None = None) -> pd.DataFrame:
    """``repeats`` rounds of throughput runs (unpaced, ``records``), then ``latency_repeats``
    (default ``repeats``) rounds of latency runs (paced at ``latency_rate``); one row each,
    ``mode`` says which and ``repeat`` the round. In a throughput round each guarantee
    takes its turn on its own lane, in alternating order; in a latency round the lanes run
    side by side, record by record (``lane.run_side_by_side``). ``transactional_loop``: the
    learner's loop runs the transactional lane (``labkit.cost.loop_run``)."""
    latency_repeats = repeats if latency_repeats is None else latency_repeats
    rows, clock = [], CpuClock.for_bootstrap(bootstrap)
    with ExitStack() as stack:
        lanes = {g: stack.enter_context(_lane(bootstrap, g, value_bytes, transactional_loop))
                 for g in guarantees}

        def interval(g: str) -> float | None:
            return commit_interval_ms if GUARANTEES[g].transactional else None

        for repeat in range(repeats):
            for g in _turns(list(guarantees), repeat):
                rows.append({"mode": "throughput", "repeat": repeat,
                             **_timed(clock, lanes[g], records, interval(g))})
        for repeat in range(latency_repeats):
            # Side by side, record by record: a pause of the machine delays every guarantee's
            # records alike, so it cannot make one of them look slow (one after another, a
            # pause during one lane's 0.3 s did just that in a CI run).
            turns = [(lanes[g], None, interval(g)) for g in _turns(list(guarantees), repeat)]
            for m in run_side_by_side(turns, latency_records, latency_rate):
                rows.append({"mode": "latency", "repeat": repeat, **asdict(m)})
    return pd.DataFrame(rows)


def commit_grid(bootstrap: str, value_sizes: tuple[int, ...] = (100, 1024),
                intervals_ms: tuple[float, ...] = (10.0, 100.0),
                records: int | dict[int, int] = 20_000, repeats: int = 5,
                transactional_loop: Callable | None = None) -> pd.DataFrame:
    """Throughput of transactional runs committing every ``interval`` ms, per value size,
    each beside an ``at_least_once`` run of the same size in the same round (the paired
    baseline). ``records`` may be given per value size. Rows as ``compare_guarantees``
    (mode "throughput"), plus ``config``: "at_least_once" or "transactional@<interval>ms"."""
    rows, clock = [], CpuClock.for_bootstrap(bootstrap)
    for size in value_sizes:  # one size's topics are gone before the next size's are made
        n = records[size] if isinstance(records, dict) else records
        with _grid_lanes(bootstrap, size, intervals_ms, transactional_loop) as configs:
            for repeat in range(repeats):
                for config, lane, interval in _turns(configs, repeat):
                    rows.append({"mode": "throughput", "repeat": repeat, "config": config,
                                 **_timed(clock, lane, n, interval)})
    return pd.DataFrame(rows)


@contextmanager
def _grid_lanes(bootstrap: str, size: int, intervals_ms: tuple[float, ...],
                loop: Callable | None) -> Iterator[list[tuple[str, Lane, float | None]]]:
    """(config, lane, interval) of one record size: at_least_once, then one transactional
    lane run at each commit interval."""
    with Lane(bootstrap, "at_least_once", size) as alo, \
            _lane(bootstrap, "transactional", size, loop) as txn:
        yield [("at_least_once", alo, None)] + [
            (f"transactional@{interval:g}ms", txn, interval) for interval in intervals_ms]


def wire_grid(bootstrap: str, value_sizes: tuple[int, ...] = (100, 1024),
              intervals_ms: tuple[float, ...] = (10.0, 100.0),
              records: int | dict[int, int] = 10_000,
              transactional_loop: Callable | None = None) -> pd.DataFrame:
    """``commit_grid``'s configurations, one run each with every client connection through
    the fault proxy (no fault set): what each run exchanged with the broker, per API
    (``cost_units.wire_delta``), and ``add_partitions_refused``: the AddPartitionsToTxn
    requests the coordinator answered with an error (the client retries those). Not timed:
    the proxy shares this process's CPU, so these runs count, they do not race."""
    rows = []
    for size in value_sizes:
        n = records[size] if isinstance(records, dict) else records
        answers: list[dict] = []
        with FaultProxy(bootstrap, trace=answers.append,
                        trace_apis={"AddPartitionsToTxn"}) as proxy, \
                _grid_lanes(proxy.bootstrap, size, intervals_ms, transactional_loop) as configs:
            for config, lane, interval in configs:
                before, seen = proxy.stats(), len(answers)
                m = lane.run(n, commit_interval_ms=interval)
                rows.append({"config": config, **asdict(m), **wire_delta(before, proxy.stats()),
                             "add_partitions_refused": sum(
                                 1 for a in answers[seen:] if a["error"] is not None)})
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
