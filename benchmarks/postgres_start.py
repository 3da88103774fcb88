"""The lab's PostgreSQL: how long initdb, the start and the stop take.

    .venv/bin/python benchmarks/postgres_start.py [RUNS]

Each run starts a server in a fresh lab home of its own (labkit.storage.postgres.LabPostgres,
as `labkit up` and the test suite do: initdb into a new data directory, the server until it
accepts a connection), then stops it and removes its data. Prints each run's initdb, start
and stop seconds, their medians, how the server ran (as you, or as root: in a user
namespace) and the load average. Results: docs/measurements.md, "The lab's PostgreSQL".
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from labkit.storage import postgres
from labkit.storage.server_user import run_as


def main(runs: int) -> None:
    rows = []
    for i in range(runs):
        home = Path(tempfile.mkdtemp(prefix="labkit-pg-bench-"))
        try:
            server = postgres.LabPostgres(home).start()
            began = time.monotonic()
            server.stop()
            rows.append((server.init_s, server.start_s, time.monotonic() - began))
            print(f"run {i + 1}: initdb {rows[-1][0]:.2f} s, start {rows[-1][1]:.2f} s, "
                  f"stop {rows[-1][2]:.2f} s", flush=True)
        finally:
            shutil.rmtree(home, ignore_errors=True)
    init, start, stop = (statistics.median(col) for col in zip(*rows))
    print(f"median of {runs}: initdb {init:.2f} s, start {start:.2f} s, stop {stop:.2f} s "
          f"({postgres.version()}, runs {run_as([postgres.binaries()]).describe()}; "
          f"load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
