"""Which order of the suite's files keeps two cores busiest: a replay, not a run.

    python benchmarks/suite_order.py junit.xml    # a run's --junitxml, with cpu_s properties

Replays the report's files on four workers, each taking the next file of an order when it is
free, with the cores shared out when the running files want more than there are (each file
slows by the same factor). It prints the modelled length of the suite for longest first and
for the planned order (tests/file_seconds.py). A model: it ranks orders, the runs in
docs/measurements.md say how long the suite takes.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.file_seconds import CORES_FOR_TESTS, WORKERS, measured, planned_order  # noqa: E402


def replay(order: list[str], files: dict[str, tuple[float, float]], workers: int = WORKERS,
           cores: float = CORES_FOR_TESTS, step_s: float = 1.0) -> float:
    """Seconds until the last file ends: each running file advances by ``step_s`` of its own
    time per ``step_s``, times cores / demand when the running files want more than ``cores``."""
    queue, running, now = list(order), {}, 0.0  # running: file -> its own seconds left
    while queue or running:
        while queue and len(running) < workers:
            name = queue.pop(0)
            running[name] = files[name][0]
        demand = sum(files[f][1] / files[f][0] for f in running if files[f][0] > 0)
        pace = min(1.0, cores / demand) if demand else 1.0
        now += step_s
        for name in list(running):
            running[name] -= step_s * pace
            if running[name] <= 0:
                del running[name]
    return now


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/suite_order.py JUNIT_XML")
    files = {path: (row[0], row[1]) for path, row in measured(Path(sys.argv[1])).items()}
    longest = sorted(files, key=lambda f: (-files[f][0], f))
    cpu = sum(c for _, c in files.values())
    print(f"{len(files)} files, {sum(s for s, _ in files.values()):.0f} s of tests, "
          f"{cpu:.0f} CPU s measured in them")
    for name, order in (("longest first", longest), ("planned", planned_order(files))):
        print(f"{name:>14}: {replay(order, files) / 60:.1f} min modelled")


if __name__ == "__main__":
    main()
