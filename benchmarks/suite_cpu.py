"""How busy the machine is while a command runs (the whole suite), and whose CPU it is.

    python benchmarks/suite_cpu.py -- bash .ci/run          # in a fresh clone
    python benchmarks/suite_cpu.py --every 2 -- make test

Every ``--every`` seconds it reads the machine's busy share and each process's CPU time
(psutil); at the end it prints the busy share per minute and the CPU per kind of process
(brokers, Spark JVMs, Connect, notebook kernels, Python). A process already running when
the command started counts only what it used after. docs/measurements.md ("Stop 48")
records the results that chose the test workers.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter

import psutil

KINDS = (("kafka.Kafka", "broker"), ("StorageTool", "broker storage format"),
         ("org.apache.spark", "Spark JVM"), ("ConnectDistributed", "Connect JVM"),
         ("org.apache.flink", "Flink JVM"), ("java", "other JVM"), ("postgres", "PostgreSQL"),
         ("ipykernel", "notebook kernel"), ("xdist", "pytest"), ("pytest", "pytest"),
         ("python", "Python"))


def kind_of(cmdline: list[str]) -> str:
    text = " ".join(cmdline)
    return next((kind for mark, kind in KINDS if mark in text), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        sys.exit("give the command to measure after --, e.g. -- bash .ci/run")
    before = {(p.pid, p.info["create_time"]): sum(p.info["cpu_times"][:2])
              for p in psutil.process_iter(["create_time", "cpu_times"]) if p.info["cpu_times"]}
    seen: dict[tuple[int, float], tuple[str, float]] = {}
    busy: list[tuple[float, float]] = []
    psutil.cpu_percent(None)
    started = time.monotonic()
    with subprocess.Popen(command) as proc:
        while proc.poll() is None:
            time.sleep(args.every)
            busy.append((time.monotonic() - started, psutil.cpu_percent(None)))
            for p in psutil.process_iter(["cmdline", "create_time", "cpu_times"]):
                key = (p.pid, p.info["create_time"])
                if p.info["cpu_times"] is None:
                    continue
                used = sum(p.info["cpu_times"][:2]) - before.get(key, 0.0)
                kind = seen[key][0] if key in seen else kind_of(p.info["cmdline"] or [])
                seen[key] = (kind, used)
    print(f"{command[0]}... exited {proc.returncode} after {time.monotonic() - started:.0f} s; "
          f"machine busy {sum(b for _, b in busy) / max(len(busy), 1):.0f} % on average")
    for minute in range(0, int(busy[-1][0] // 60) + 1 if busy else 0):
        shares = [b for t, b in busy if minute * 60 <= t < (minute + 1) * 60]
        print(f"  minute {minute:3d}: {sum(shares) / max(len(shares), 1):5.1f} % busy")
    per_kind, count = Counter(), Counter()
    for kind, used in seen.values():
        per_kind[kind] += used
        count[kind] += 1
    for kind, used in per_kind.most_common():
        print(f"  {kind:22s} {used:7.0f} s CPU ({count[kind]} processes)")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
