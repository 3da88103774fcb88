"""Notebook 09's costs in units a shared machine does not blur: the requests and bytes on the
wire (counted by the fault proxy) and the CPU time of the client and the broker; and the
published shape's verdicts, on numbers made up to test them."""
from __future__ import annotations

import math
import time

import pandas as pd
import pytest

from labkit.cost import bench, cost_units, findings, published
from labkit.cost.lane import Lane
from labkit.faults.proxy import FaultProxy


def test_the_wire_shows_one_end_txn_and_one_accepted_add_partitions_per_commit(bootstrap):
    refused = []
    with FaultProxy(bootstrap, trace=refused.append, trace_apis={"AddPartitionsToTxn"}) as proxy, \
            Lane(proxy.bootstrap, "transactional", value_bytes=64) as lane:
        before, refused[:] = proxy.stats(), []
        m = lane.run(23, records_per_txn=5)
        wire = cost_units.wire_delta(before, proxy.stats())
    assert m.transactions == 5 and m.delivered == 23
    accepted = wire["requests_AddPartitionsToTxn"] - sum(1 for a in refused if a["error"])
    assert (wire["requests_EndTxn"], accepted) == (5, 5)  # one partition: one of each a commit
    assert wire["requests_Produce"] >= 5  # a transaction's records are never in the next one's request
    assert wire["bytes_Produce"] > 23 * 64 and wire["bytes_EndTxn"] > 0
    assert wire["requests_Fetch"] >= 1 and wire["bytes_Fetch"] > 23 * 64  # the reader read them


def test_wire_grid_counts_each_configuration_and_its_table(bootstrap):
    wire = bench.wire_grid(bootstrap, value_sizes=(64,), intervals_ms=(5.0, 50.0), records=60)
    assert list(wire["config"]) == ["at_least_once", "transactional@5ms", "transactional@50ms"]
    alo = wire.iloc[0]
    assert alo["transactions"] == 0 and alo["requests_EndTxn"] == alo["requests_AddPartitionsToTxn"] == 0
    assert (wire["transactions"].iloc[1:] >= 1).all() and cost_units.one_of_each_per_commit(wire)
    requests, sizes = cost_units.wire_requests_table(wire), cost_units.wire_bytes_table(wire)
    assert list(requests.index) == ["64 B, transactional@5ms", "64 B, transactional@50ms"]
    assert requests.loc["64 B, transactional@5ms", "EndTxn"] == 1.0
    assert sizes.loc["64 B, at_least_once", "vs at_least_once"] == "+0.00 %"
    assert sizes.loc["64 B, at_least_once", "txn request bytes per commit"] == ""  # no commits
    assert sizes.loc["64 B, transactional@5ms", "txn request bytes per commit"] > 0


def test_one_of_each_per_commit_fails_on_a_missing_end_txn():
    wire = pd.DataFrame([{"transactions": 3, "requests_EndTxn": 2, "requests_AddPartitionsToTxn": 4,
                          "add_partitions_refused": 1}])
    assert not cost_units.one_of_each_per_commit(wire)
    assert cost_units.one_of_each_per_commit(wire.assign(requests_EndTxn=3))
    assert not cost_units.one_of_each_per_commit(wire.assign(transactions=0))  # nothing to check


def test_the_cpu_clock_reads_this_process_and_the_local_broker(bootstrap):
    clock = cost_units.CpuClock.for_bootstrap(bootstrap)
    assert clock.broker is not None  # the test broker listens on this machine
    start = clock.read()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn 50 ms of this process's CPU
        pass
    client_ms, broker_ms = clock.since(start)
    assert client_ms >= 50 and broker_ms >= 0
    assert cost_units.broker_pid("192.0.2.1:9092") is None  # not ours to read
    assert math.isnan(cost_units.CpuClock(None).read()[1])


def test_grid_runs_carry_their_cpu_and_the_summary_pairs_it(bootstrap):
    grid = bench.commit_grid(bootstrap, value_sizes=(64,), intervals_ms=(50,), records=40, repeats=2)
    assert (grid["client_cpu_ms"] > 0).all() and (grid["broker_cpu_ms"] >= 0).all()
    table = findings.summarize_grid(grid)
    assert (table["client_cpu_ms_per_1k"] > 0).all()
    assert table.loc[(64, "at_least_once"), "client_cpu_vs_baseline_pct"] == 0
    view = findings.cpu_view(table)
    assert "%" not in view.loc[(64, "at_least_once")].iloc[0]  # the baseline's row: ms alone
    assert "%" in view.loc[(64, "transactional@50ms")].iloc[0]


def _grid(tput: dict[str, list[float]], cpu: dict[str, list[float]], size: int) -> list[dict]:
    return [{"mode": "throughput", "repeat": r, "value_bytes": size, "config": config,
             "records": 1000, "records_per_s": tput[config][r],
             "client_cpu_ms": cpu[config][r], "broker_cpu_ms": cpu[config][r]}
            for config in tput for r in range(len(tput[config]))]


@pytest.mark.parametrize("short_faster, verdict", [(False, "reproduced"), (True, "contradicted")])
def test_the_published_shape_says_what_the_paired_rounds_say(short_faster, verdict):
    alo = [100.0, 60.0, 90.0, 50.0]  # a noisy machine: the rounds' pairs move together
    slow, fast = [a * 0.5 for a in alo], [a * 0.97 for a in alo]
    short, long_ = (fast, slow) if short_faster else (slow, fast)
    cpu = {"at_least_once": [10.0] * 4, "transactional@10ms": [20.0] * 4,
           "transactional@100ms": [11.0] * 4}
    rows = []
    for size in (100, 1024):
        rows += _grid({"at_least_once": alo, "transactional@10ms": short,
                       "transactional@100ms": long_}, cpu, size)
    shape = published.shape(pd.DataFrame(rows))
    claims = list(shape.index)
    says = shape["throughput says"]
    assert says[claims[1]] == says[claims[2]] == verdict
    # the CPU per record is higher at 10 ms in every round, whatever the throughput did
    assert shape.loc[claims[1], "CPU says"] == shape.loc[claims[2], "CPU says"] == "reproduced"
    # 1 KB every 100 ms: -3 % in every round when it is the fast one (close to at-least-once)
    assert says[claims[0]] == ("contradicted" if short_faster else "reproduced")
    # the same cost at both sizes: smaller records are not shown to cost more
    assert says[claims[3]] == shape.loc[claims[3], "CPU says"] == "not shown beyond the spread"
    assert "CPU per record +81.8 %" in shape.loc[claims[1], "measured here (paired rounds)"]
