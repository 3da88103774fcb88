"""Consumer groups: the rebalance pause per group protocol, and exactly_once throughput with
one instance versus three.

    .venv/bin/python benchmarks/groups.py           # starts (or reuses) a `labkit up` lab
    LABKIT_BOOTSTRAP=127.0.0.1:9092 .venv/bin/python benchmarks/groups.py

Rebalance pause: 3 instances of consume-transform-produce (exactly_once) over 6 partitions;
instance 0 is SIGKILLed at after-send-offsets-before-commit on its 2nd batch; the pause is
the time from its death (the supervisor reaps it) to the first batch processed again from a
partition it held (``labkit.checking.timeline.rebalance_pause``), from the run's history.

Throughput: the whole run of N records (input written beforehand, excluded) with 1 and 3
instances, no crash; records / wall seconds of the supervisor's run (process starts, group
joins and the wait for all members included: that fixed cost is part of what an operator
sees at this size).
"""
from __future__ import annotations

import statistics
import sys

from labkit import experiments

CTP = "consume-transform-produce"
PAUSE_REPEATS = 5
THROUGHPUT_RECORDS = 20_000  # at 5,000 the fixed start-up cost dominates (see the doc)
THROUGHPUT_REPEATS = 3


def pauses(protocol: str) -> list[float]:
    out = []
    for _ in range(PAUSE_REPEATS):
        run = experiments.run(CTP, guarantee="exactly_once",
                              crash_at="after-send-offsets-before-commit",
                              records=180, instances=3, partitions=6,
                              group_protocol=protocol)
        assert run.report.exactly_once and run.run.crashed
        out.append(run.rebalance_pause())
    return out


def throughput(instances: int) -> list[float]:
    out = []
    for _ in range(THROUGHPUT_REPEATS):
        run = experiments.run(CTP, guarantee="exactly_once",
                              records=THROUGHPUT_RECORDS,
                              instances=instances, partitions=6)
        assert run.report.exactly_once
        out.append(THROUGHPUT_RECORDS / run.run.total_s)
    return out


def row(label: str, values: list[float], unit: str) -> str:
    return (f"| {label} | {statistics.median(values):.1f} {unit} | {min(values):.1f} | "
            f"{max(values):.1f} | {len(values)} |")


def main() -> None:
    print("| measurement | median | min | max | runs |")
    print("|---|---|---|---|---|")
    for protocol in ("classic", "consumer"):
        print(row(f"rebalance pause, {protocol} protocol", pauses(protocol), "s"), flush=True)
    for instances in (1, 3):
        print(row(f"exactly_once throughput, {instances} instance(s), 6 partitions, "
                  f"{THROUGHPUT_RECORDS} records", throughput(instances), "records/s"), flush=True)


if __name__ == "__main__":
    sys.exit(main())
