"""Notebook 09's latency rounds while the broker is paused now and then: does another
guarantee ever look slower to a read_committed reader than the transactional one?

    LABKIT_HOME=/tmp/lat-lab .venv/bin/labkit up
    LABKIT_HOME=/tmp/lat-lab .venv/bin/python benchmarks/latency_pauses.py --runs 6

Each run is the notebook's ``bench.compare_guarantees`` call (7 throughput rounds of 40,000
records, 3 latency rounds of 300) while a thread SIGSTOPs the lab's broker for 150 ms at
random moments (every 0.3-1.2 s): a stand-in for a garbage-collection pause or a core busy
with another test. Per latency round it prints each guarantee's p50 and the largest ratio
of another guarantee's p50 to the transactional one's (>= 1: that round, another guarantee
looked at least as slow). Exits 1 if any run's median says another guarantee was slowest.
"""
from __future__ import annotations

import argparse
import json
import random
import threading
import time

from labkit.cost import bench, findings
from labkit.kafka import cluster


def pause_now_and_then(lab, stop: threading.Event, pause_s: float = 0.15) -> None:
    """Freeze the broker for ``pause_s`` at random moments until ``stop`` (thawed on every
    way out: ``LocalCluster.frozen``)."""
    rng = random.Random(1)
    node = lab.brokers[0].node_id
    while not stop.wait(rng.uniform(0.3, 1.2)):
        with lab.frozen(node):
            time.sleep(pause_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    lab = cluster.ensure()
    if len(getattr(lab, "brokers", ())) != 1:
        raise SystemExit("needs the local one-broker lab (labkit up), not an external cluster")
    stop = threading.Event()
    pauser = threading.Thread(target=pause_now_and_then, args=(lab, stop), daemon=True)
    pauser.start()
    wrong = 0
    try:
        for run in range(args.runs):
            runs = bench.compare_guarantees(lab.bootstrap, records=40_000, value_bytes=1024,
                                            repeats=7, latency_records=300, latency_repeats=3)
            latency = runs[runs["mode"] == "latency"]
            p50 = {g: list(rows.sort_values("repeat")["latency_p50_ms"].round(1))
                   for g, rows in latency.groupby("guarantee")}
            txn = p50["transactional"]
            ratios = [round(max(v[k] for g, v in p50.items() if g != "transactional") / txn[k], 2)
                      for k in range(len(txn))]
            slowest = findings.conclude(findings.summarize(runs)).slowest_to_read
            wrong += slowest != "transactional"
            print(json.dumps({"run": run, "p50_ms": p50, "others_vs_txn": ratios,
                              "slowest": slowest}), flush=True)
    finally:
        stop.set()
        pauser.join()
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
