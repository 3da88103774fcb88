"""CPU of a lab broker's life (storage format, start, some records, stop), per JVM option set.

    python benchmarks/jvm_start.py                       # the lab's defaults
    LABKIT_BROKER_JAVA_OPTS="-XX:+UseG1GC" python benchmarks/jvm_start.py
    python benchmarks/jvm_start.py --records 100000

The JVMs' CPU time is what the OS counted for this process's children (the broker and its
storage-format JVM); docs/measurements.md ("Lighter JVMs") records the results.
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time

from labkit import settings
from labkit.kafka import topics
from labkit.kafka.localcluster import LocalCluster
from labkit.pipelines import data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds the broker idles")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as home:
        lab = LocalCluster(brokers=1, home=home).start()
        ready = time.monotonic() - started
        try:
            topics.create(lab.bootstrap, "jvm-start")
            data.load_into_topic(lab.bootstrap, "jvm-start", data.generate(args.records))
            time.sleep(args.idle)
        finally:
            lab.stop()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"options {settings.current().broker_java_opts!r}: ready after {ready:.1f} s, "
          f"{time.monotonic() - started:.1f} s in all, "
          f"JVM CPU {used.ru_utime + used.ru_stime:.1f} s")


if __name__ == "__main__":
    main()
