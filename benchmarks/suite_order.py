"""Which order of the suite's files, on how many workers, keeps two cores busiest: a replay,
not a run.

    python benchmarks/suite_order.py junit.xml    # a run's --junitxml, with cpu_s properties

Replays the report's tests as pytest-xdist runs them (``--dist loadfile``): a worker is handed
a whole file at the start and another whenever it holds 2 tests or fewer not yet reported,
and it runs a test only while it holds two or more (xdist's worker waits to know the next
test) or nothing is left to hand out. The cores are shared when the running tests want more
than there are (each slows by the same factor). It prints the modelled length of the suite for
longest first and for the planned order (tests/file_seconds.py), on 4 and 5 workers. A model:
it ranks orders, the runs in docs/measurements.md say how long the suite takes.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.file_seconds import CORES_FOR_TESTS, planned_order, tests_of  # noqa: E402

HANDED_AT_PENDING = 2  # xdist's LoadScopeScheduling hands the next file at this many left


def replay(order: list[str], tests: dict[str, list[tuple[float, float]]], workers: int,
           cores: float = CORES_FOR_TESTS, step_s: float = 0.25) -> float:
    """Seconds until the last test ends, xdist's hand-out replayed (the module's docstring)."""
    queue = list(order)
    held: list[list[list[float]]] = [[] for _ in range(workers)]  # [seconds left, cores]

    def hand_out(w: int, up_to: int = HANDED_AT_PENDING) -> None:
        if queue and len(held[w]) <= up_to:
            held[w].extend([s, c / s if s > 0 else 0.0] for s, c in tests[queue.pop(0)])

    for w in range(workers):  # xdist's start: one file each, then a second where it is due
        hand_out(w, up_to=0)
    for w in range(workers):
        hand_out(w)
    now = 0.0
    while any(held):
        running = [w for w in range(workers) if held[w] and (len(held[w]) >= 2 or not queue)]
        demand = sum(held[w][0][1] for w in running)
        pace = min(1.0, cores / demand) if demand else 1.0
        now += step_s
        for w in running:
            held[w][0][0] -= step_s * pace
            while held[w] and held[w][0][0] <= 0:
                held[w].pop(0)
                hand_out(w)
                if len(held[w]) < 2 and queue:
                    break
    return now


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/suite_order.py JUNIT_XML")
    tests = tests_of(Path(sys.argv[1]))
    files = {f: (sum(s for s, _ in t), sum(c for _, c in t)) for f, t in tests.items()}
    longest = sorted(files, key=lambda f: (-files[f][0], f))
    print(f"{len(files)} files, {sum(s for s, _ in files.values()):.0f} s of tests, "
          f"{sum(c for _, c in files.values()):.0f} CPU s measured in them")
    for workers in (4, 5):
        for name, order in (("longest first", longest),
                            ("planned", planned_order(files, workers=workers))):
            print(f"{workers} workers, {name:>13}: "
                  f"{replay(order, tests, workers) / 60:.1f} min modelled")


if __name__ == "__main__":
    main()
