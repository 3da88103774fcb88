"""Flink's two-phase-commit Kafka sink, measured (labkit/flink): what first use costs, the
output's latency per checkpoint interval, crashes at each kill point for both delivery
guarantees, the transaction-timeout trap against the setting that avoids it, and the
broker's refusal of a timeout above its maximum.

    python benchmarks/flink.py first-use          # PyFlink's environment from nothing
    python benchmarks/flink.py latency --intervals 500 1000 2000
    python benchmarks/flink.py crashes --repeats 3
    python benchmarks/flink.py timeout
    python benchmarks/flink.py all

Runs on a lab of its own (or LABKIT_BOOTSTRAP). Prints markdown rows for
docs/measurements.md.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labkit import experiments
from labkit.flink.clients import GUARANTEES
from labkit.kafka import cluster


def first_use() -> None:
    """Create PyFlink's environment in an empty cache, pip's own cache off: the download
    and install a fresh machine pays once (the connector jars come from ~/.m2 if there)."""
    cache = Path(tempfile.mkdtemp(prefix="labkit-flink-first-use-"))
    env = {**os.environ, "LABKIT_CACHE": str(cache), "PIP_NO_CACHE_DIR": "1"}
    code = ("import time; from labkit.flink import environment as e; t = time.monotonic(); "
            "e.python(); a = time.monotonic(); e.connector_jars(); b = time.monotonic(); "
            "print(round(a - t, 1), round(b - a, 1))")
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
        venv = sum(f.stat().st_size for f in (cache / "apps").rglob("*") if f.is_file())
        jars = sum(f.stat().st_size for f in (cache / "jars").rglob("*.jar"))
        print("| PyFlink environment (pip, no cache) | connector jars (mvn) | venv on disk "
              "| jars |")
        print("|---|---|---|---|")
        print(f"| {out[-2]} s | {out[-1]} s | {venv / 2**20:.0f} MiB | {jars / 2**20:.0f} MiB |")
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def latency(bootstrap: str, intervals: list[int], stream_s: float, rate: float) -> None:
    print("| checkpoint interval | payments | visible to read_committed p50 / p99 ms "
          "| first checkpoint after the start | run |")
    print("|---|---|---|---|---|")
    for interval in intervals:
        began = time.monotonic()
        run = experiments.run("flink-latency", cluster=bootstrap, keep_topics=False,
                              checkpoint_interval_ms=interval, stream_s=stream_s, rate=rate)
        q = run.latency
        print(f"| {interval} ms | {q['records']} | {q['p50_ms']:.0f} / {q['p99_ms']:.0f} | "
              f"{run.starts[0].first_checkpoint_s} s | {time.monotonic() - began:.0f} s |",
              flush=True)


def crashes(bootstrap: str, repeats: int) -> None:
    print("| guarantee | kill point | payments | lost | duplicated | aborted in log "
          "| checkpoints looked at | restore to first checkpoint | what the kill hit |")
    print("|---|---|---|---|---|---|---|---|---|")
    for guarantee in GUARANTEES:
        for point in ("mid-checkpoint", "before-commit", "random"):
            for _ in range(repeats):
                run = experiments.run("flink-crash", cluster=bootstrap, guarantee=guarantee,
                                      kill_at=point, keep_topics=False)
                r, (kill,) = run.report, run.kills
                print(f"| {guarantee} | {point} | {r.produced} | {r.lost} | {r.duplicated} | "
                      f"{r.aborted_in_log} | {kill.tries} | {run.restore_s[0]} s | "
                      f"{kill.describe()} |", flush=True)


def timeout_trap(bootstrap: str, down_s: float) -> None:
    print("| transaction.timeout.ms | down after the kill | payments | lost | duplicated "
          "| the sink's transaction | Flink said |")
    print("|---|---|---|---|---|---|---|")
    for timeout_ms in (4000, 60_000):
        run = experiments.run("flink-timeout-trap", cluster=bootstrap, down_s=down_s,
                              transaction_timeout_ms=timeout_ms, keep_topics=False)
        (kill,) = run.kills
        end = next((state for state, ids in run.transactions.items()
                    if kill.transaction in ids), "?")
        said = run.flink_said[0].split(" - ", 1)[-1][:160] if run.flink_said else ""
        print(f"| {timeout_ms} | {down_s:g} s | {run.report.produced} | {run.report.lost} | "
              f"{run.report.duplicated} | {kill.transaction}: {end} | {said} |", flush=True)
    refusal = experiments.run("flink-refused-start", cluster=bootstrap, keep_topics=False)
    print(f"\n{refusal.summary()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("first-use", "latency", "crashes", "timeout", "all"))
    parser.add_argument("--intervals", type=int, nargs="*", default=[500, 1000, 2000])
    parser.add_argument("--stream-s", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--down-s", type=float, default=6.0)
    args = parser.parse_args()
    if args.what in ("first-use", "all"):
        first_use()
    if args.what == "first-use":
        return
    bootstrap = cluster.ensure().bootstrap
    if args.what in ("latency", "all"):
        latency(bootstrap, args.intervals, args.stream_s, args.rate)
    if args.what in ("crashes", "all"):
        crashes(bootstrap, args.repeats)
    if args.what in ("timeout", "all"):
        timeout_trap(bootstrap, args.down_s)


if __name__ == "__main__":
    main()
