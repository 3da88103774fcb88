"""The transaction requests of notebook 09's transactional lane, traced through the fault proxy:
how often the coordinator refuses AddPartitionsToTxn (CONCURRENT_TRANSACTIONS: the last
transaction's markers are still being written after EndTxn was answered), how long the
client waits before it asks again, and how long EndTxn takes to be answered.

    LABKIT_HOME=/tmp/cost-lab .venv/bin/labkit up
    LABKIT_HOME=/tmp/cost-lab .venv/bin/python benchmarks/cost_wire_trace.py [records] [rounds]

One Markdown line per (value size, interval), for docs/measurements.md.
"""
from __future__ import annotations

import os
import statistics
import sys

from labkit.cost.lane import Lane
from labkit.faults.proxy import FaultProxy
from labkit.kafka import cluster


def main(records: int = 40_000, rounds: int = 3) -> None:
    lab = cluster.ensure()
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.1f}\n")
    print("| value bytes | commit every | commits | AddPartitionsToTxn refused per commit "
          "| wait before asking again, ms (median, range) | EndTxn answered in ms (median, p90) |")
    print("|---|---|---|---|---|---|")
    for size in (100, 1024):
        for interval in (10.0, 100.0):
            trace: list[dict] = []
            with FaultProxy(lab.bootstrap, trace=trace.append,
                            trace_apis={"AddPartitionsToTxn", "EndTxn"}) as proxy, \
                    Lane(proxy.bootstrap, "transactional", size) as lane:
                trace.clear()  # the warm-up transaction is not measured
                commits = sum(lane.run(records, commit_interval_ms=interval).transactions
                              for _ in range(rounds))
            adds = [e for e in trace if e["api"] == "AddPartitionsToTxn"]
            refused = [i for i, e in enumerate(adds) if e["error"]]
            gaps = [(adds[i + 1]["t"] - adds[i]["t"]) * 1000 for i in refused if i + 1 < len(adds)]
            ends = sorted(e["ms"] for e in trace if e["api"] == "EndTxn")
            wait = (f"{statistics.median(gaps):.0f} ({min(gaps):.0f}-{max(gaps):.0f})"
                    if gaps else "none refused")
            print(f"| {size} | {interval:g} ms | {commits} | {len(refused) / commits:.2f} | {wait} | "
                  f"{statistics.median(ends):.1f}, {ends[int(0.9 * (len(ends) - 1))]:.1f} |")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
