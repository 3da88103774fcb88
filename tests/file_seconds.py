"""How long each test file and notebook took in a whole run, and how much CPU it used, to
order the files so the machine stays busy.

pytest-xdist (``--dist loadfile --no-loadscope-reorder``) hands whole files to its workers in
collection order. Its default order, most tests first, left one-test files of two minutes
(production's torture, the solved capstone) to the end, one worker busy and the others idle:
1.5 min of a 29 min run (docs/measurements.md, "Stop 48"). Longest first packed them, but put
the files that mostly wait (Kafka's default timeouts, failovers) side by side: minutes 8-11
of a 25 min run at 25-68 % of the two cores ("Stop 62"). So the order is planned: the
workers are replayed from the measured times, and each free worker takes the longest file
that keeps the running files' CPU within the cores, or else the one that adds least.

    LABKIT_SUITE_CPU=1 PYTEST_ADDOPTS=--junitxml=junit.xml make test
    python -m tests.file_seconds junit.xml   # rewrites the table
"""
from __future__ import annotations

import heapq
import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")
UNKNOWN_S = 10.0  # a file not in the table yet (about a median file's time)
UNKNOWN_CORES = 0.5  # a file whose CPU is not measured yet (about the suite's mean)
MEASURE_ENV = "LABKIT_SUITE_CPU"  # set to 1: each test's CPU goes to the junit report
# Two cores, less what each worker's own broker and the lab's servers burn beside the tests
# (brokers' CPU is the largest share of a run: docs/measurements.md, "Stop 62").
CORES_FOR_TESTS = 1.7
WORKERS = 5  # the Makefile's TEST_WORKERS (a run passes its own count)
CPU_PROPERTY = "cpu_s"


def _path_of(case: ElementTree.Element) -> str:
    module = case.get("classname", "")
    return (module.replace(".", "/") + ".py" if not module.endswith(".ipynb")
            else module.replace(".", "/", module.count(".") - 1))


def tests_of(junit_xml: Path) -> dict[str, list[tuple[float, float]]]:
    """Each file's tests (``tests/x.py``, ``notebooks/x.ipynb``) in run order, as
    ``(seconds, cpu seconds)`` from a junit report; the CPU comes from each test's ``cpu_s``
    property (conftest.py, when the run had ``LABKIT_SUITE_CPU=1``)."""
    tests: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        cpu = sum(float(prop.get("value", 0)) for prop in case.iter("property")
                  if prop.get("name") == CPU_PROPERTY)
        tests[_path_of(case)].append((float(case.get("time", 0)), cpu))
    return tests


def measured(junit_xml: Path) -> dict[str, list[float]]:
    """``[seconds, cpu seconds]`` per file from a junit report (``tests_of``, summed)."""
    return {path: [round(sum(s for s, _ in cases), 1), round(sum(c for _, c in cases), 1)]
            for path, cases in sorted(tests_of(junit_xml).items())}


class TreeCpu:
    """The CPU of this process and all its descendants, sampled every ``every_s`` by a
    thread: a test's share is what its window added, the worker's broker, Spark JVM, kernels
    and the loops it started included (a process that exits between samples loses at most
    ``every_s`` of CPU). Reaped children's totals (``os.times``) miss what is shared across
    tests (the worker's Spark session) and what is killed, not waited for."""

    def __init__(self, every_s: float = 0.5) -> None:
        import threading

        import psutil

        self._root, self._every_s = psutil.Process(), every_s
        self._seen: dict[tuple[int, float], float] = {}  # (pid, created) -> CPU seconds
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="tree-cpu", daemon=True).start()

    def sample(self) -> None:
        import psutil

        for p in [self._root, *self._root.children(recursive=True)]:
            try:
                key, times = (p.pid, p.create_time()), p.cpu_times()
            except psutil.Error:  # gone since the listing
                continue
            with self._lock:
                self._seen[key] = times.user + times.system

    def _run(self) -> None:
        import time

        while True:
            self.sample()
            time.sleep(self._every_s)

    def mark(self) -> dict[tuple[int, float], float]:
        self.sample()
        with self._lock:
            return dict(self._seen)

    def since(self, mark: dict[tuple[int, float], float]) -> float:
        now = self.mark()
        return sum(cpu - mark.get(key, 0.0) for key, cpu in now.items())


def planned_order(files: dict[str, tuple[float, float]], workers: int = WORKERS,
                  cores: float = CORES_FOR_TESTS) -> list[str]:
    """The files in the order to hand them out, from ``(seconds, cpu seconds)`` each: the
    workers are replayed at the measured times; a free worker takes the longest file that
    keeps the running files' cores within ``cores``, else the file that adds fewest."""
    left = sorted(files, key=lambda f: (-files[f][0], f))
    cores_of = {f: (c / s if s > 0 else 0.0) for f, (s, c) in files.items()}
    running: list[tuple[float, str]] = []  # (ends at, file)
    now, busy, order = 0.0, 0.0, []
    while left:
        if len(running) == workers:
            now, done = heapq.heappop(running)
            busy -= cores_of[done]
        fits = [f for f in left if busy + cores_of[f] <= cores]
        chosen = fits[0] if fits else min(left, key=lambda f: (cores_of[f], -files[f][0]))
        left.remove(chosen)
        order.append(chosen)
        busy += cores_of[chosen]
        heapq.heappush(running, (now + files[chosen][0], chosen))
    return order


def read_table(table: Path = TABLE) -> dict[str, tuple[float, float]]:
    raw = json.loads(table.read_text()) if table.exists() else {}
    return {path: ((v, v * UNKNOWN_CORES) if isinstance(v, (int, float))
                   else (v[0], v[1] if v[1] else v[0] * UNKNOWN_CORES))
            for path, v in raw.items()}


def sort_as_planned(items: list, table: Path = TABLE, workers: int = WORKERS) -> None:
    """Sorts pytest items in the planned order of their files (``planned_order`` on
    ``workers``); a file not in the table counts as ``UNKNOWN_S`` long at ``UNKNOWN_CORES``;
    the sort is stable, so each file's own order is kept."""
    known = read_table(table)
    files = {item.nodeid.split("::")[0] for item in items}
    plan = planned_order({f: known.get(f, (UNKNOWN_S, UNKNOWN_S * UNKNOWN_CORES))
                          for f in files}, workers=workers)
    rank = {f: i for i, f in enumerate(plan)}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.file_seconds JUNIT_XML (a run's --junitxml report)")
    rows = measured(Path(sys.argv[1]))
    TABLE.write_text("{\n" + ",\n".join(f"{json.dumps(path)}: {json.dumps(row)}"
                                        for path, row in rows.items()) + "\n}\n")
    print(f"{TABLE}: {len(json.loads(TABLE.read_text()))} files")
