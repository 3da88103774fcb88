"""Measure one crash-and-restart cycle per scenario and guarantee (broker start excluded).

    LABKIT_BOOTSTRAP=127.0.0.1:9092 python benchmarks/faults.py   # or with a `labkit up` lab

The crash is armed on the *last* batch, so the restarted attempt does nothing but recover
(new process, imports, fence/abort, offsets, state restore) and finish that batch: its wall
time is the cost of one crash-and-restart cycle.
"""
from __future__ import annotations

import statistics
import sys

from labkit import experiments
from labkit.experiments import scenarios

RECORDS = 50
REPEATS = 3
POINT = {  # a point on each guarantee's path that leaves the most to recover
    ("producer", "at_most_once"): "after-commit-before-process",
    ("producer", "at_least_once"): "after-process-before-commit",
    ("producer", "exactly_once"): "in-transaction-before-commit",
    ("consumer", "at_most_once"): "after-commit-before-process",
    ("consumer", "at_least_once"): "after-process-before-commit",
    ("consumer", "exactly_once"): "after-process-before-commit",
}


def point_for(name: str, guarantee: str) -> str:
    default = {"at_most_once": "after-commit-before-process",
               "at_least_once": "after-process-before-commit",
               "exactly_once": "after-send-offsets-before-commit"}[guarantee]
    return POINT.get((name, guarantee), default)


def main() -> None:
    batches = -(-RECORDS // scenarios.batch_size(RECORDS))
    print("| scenario | guarantee | crash point (last batch) | restart attempt s (median of 3) "
          "| first attempt s | whole run s |")
    print("|---|---|---|---|---|---|")
    for name in scenarios.SCENARIOS:
        for guarantee in scenarios.GUARANTEES:
            point = point_for(name, guarantee)
            runs = [experiments.run(name, guarantee=guarantee, crash_at=point,
                                    records=RECORDS, hit=batches).run
                    for _ in range(REPEATS)]
            assert all(r.crashed for r in runs)
            med = lambda xs: statistics.median(xs)  # noqa: E731
            print(f"| {name} | {guarantee} | {point} | {med([r.restart_s for r in runs]):.2f} "
                  f"| {med([r.durations_s[0] for r in runs]):.2f} | {med([r.total_s for r in runs]):.2f} |",
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
