"""Measure the foundation: broker start (1 and 3), first SparkSession, broker memory.

    .venv/bin/python benchmarks/foundation.py          # jars must be cached (make setup)

Prints one line per measurement; docs/measurements.md records the results. Nothing here
is asserted: the machine is shared and noisy, so targets are read, not enforced.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labkit.kafka.localcluster import LocalCluster
from labkit.proc import rss_mb


def timed_cluster(brokers: int) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory() as home:
        t0 = time.monotonic()
        cluster = LocalCluster(brokers=brokers, home=Path(home)).start()
        elapsed = time.monotonic() - t0
        time.sleep(5)  # let the JVMs settle before reading memory
        rss = [rss_mb(b.pid) for b in cluster.brokers]
        cluster.stop()
    return elapsed, rss


def first_spark_session() -> float:
    code = ("import time; t=time.monotonic(); from labkit.spark import session; s=session(); "
            "s.range(1).count(); print(time.monotonic()-t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    one, rss_one = timed_cluster(1)
    print(f"single broker ready: {one:.1f} s (target <= 10 s); broker RSS {rss_one[0]:.0f} MB (target <= 600 MB)")
    three, rss_three = timed_cluster(3)
    print(f"3 brokers ready: {three:.1f} s (target <= 25 s); RSS per broker "
          + ", ".join(f"{r:.0f}" for r in rss_three) + " MB")
    print(f"first SparkSession + a trivial job: {first_spark_session():.1f} s (target <= 10 s)")


if __name__ == "__main__":
    main()
