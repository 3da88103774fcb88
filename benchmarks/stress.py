"""The flakiness budget: each experiment that kills or freezes brokers, run again and again.

    python benchmarks/stress.py                      # every experiment 20 times, with load
    python benchmarks/stress.py --runs 5 --only coordinator-failover --load 0

Each run is the real CLI command (`labkit scenario ...`, `labkit torture ...`) in a process
of its own, with a hard limit: a run still going at the limit is a **hang** (its process
group is killed), a run that exits non-zero or whose audit is not what the experiment
promises is a **failure**. The load stands in for CI's (three pytest workers on two cores):
``--load N`` busy processes run beside the experiments. Prints one markdown row per
experiment (runs, hangs, failures, p50 / p95 / max seconds) for docs/measurements.md, and
the output of every failed or hung run to stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

LABKIT = str(Path(sys.executable).with_name("labkit"))
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "torture"
HANG_S = 400.0  # no experiment here takes over 2 minutes on a loaded machine


def _exact(run: dict) -> bool:
    return run.get("lost") == 0 and run.get("duplicated") == 0


@dataclass(frozen=True)
class Experiment:
    name: str
    command: list[str]
    promised: Callable[[dict], bool]  # what every run's JSON must show
    promise: str


EXPERIMENTS = [
    Experiment("leader-failover", [LABKIT, "scenario", "leader-failover", "--acks", "all",
                                   "--min-insync", "2", "--json"],
               lambda r: r.get("lost_acknowledged") == 0, "acks=all, min.insync=2: lost_acknowledged 0"),
    Experiment("coordinator-failover", [LABKIT, "scenario", "coordinator-failover", "--json"],
               lambda r: _exact(r) and r.get("aborted_visible") == 0, "lost 0, duplicated 0"),
    Experiment("txn-timeout", [LABKIT, "scenario", "txn-timeout", "--json"], _exact,
               "lost 0, duplicated 0"),
    Experiment("poll-interval-zombie", [LABKIT, "scenario", "poll-interval-zombie", "--json"],
               _exact, "lost 0, duplicated 0 (fencing by group metadata)"),
    Experiment("share-group-freeze", [LABKIT, "scenario", "share-group", "--guarantee",
                                      "at_least_once", "--crash-at", "after-process-before-ack",
                                      "--freeze", "--records", "10", "--json"],
               lambda r: r.get("lost") == 0, "lost 0 (redelivered after the lock)"),
    Experiment("torture-broker-kills", [LABKIT, "torture", "--kills", "2", "--broker-kills", "1",
                                        "--records", "200", "--timeout", "300", "--json", "--",
                                        sys.executable, str(EXAMPLES / "exactly_once_app.py")],
               _exact, "lost 0, duplicated 0"),
    Experiment("isolated-leader", [LABKIT, "scenario", "isolated-leader", "--acks", "all",
                                   "--min-insync", "2", "--json"],
               lambda r: r.get("lost_acknowledged") == 0,
               "acks=all, min.insync=2: lost_acknowledged 0 (nothing acknowledged in the split)"),
    Experiment("isolated-leader-acks-1", [LABKIT, "scenario", "isolated-leader", "--acks", "1",
                                          "--json"],
               lambda r: r.get("lost_acknowledged") == 20,
               "acks=1: lost_acknowledged 20, the same every run (the writes the isolated leader took)"),
]


@dataclass
class Tally:
    durations: list[float] = field(default_factory=list)
    hangs: int = 0
    failures: int = 0

    def row(self, name: str, runs: int) -> str:
        d = sorted(self.durations)
        p95 = d[min(len(d) - 1, round(0.95 * (len(d) - 1)))] if d else float("nan")
        p50 = statistics.median(d) if d else float("nan")
        top = d[-1] if d else float("nan")
        return (f"| {name} | {runs} | {self.hangs} | {self.failures} | {p50:.0f} | {p95:.0f} "
                f"| {top:.0f} |")


def run_once(experiment: Experiment, limit_s: float, env: dict[str, str]
             ) -> tuple[str, float, str]:
    """("ok" | "failed" | "hung", seconds, the output when not ok)."""
    started = time.monotonic()
    child = subprocess.Popen(experiment.command, stdout=subprocess.PIPE, env=env,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = child.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the CLI and every broker it started
        out, _ = child.communicate()
        return "hung", time.monotonic() - started, out
    took = time.monotonic() - started
    if child.returncode != 0:
        return "failed", took, out
    try:
        result = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "failed", took, out
    return ("ok" if experiment.promised(result) else "failed"), took, out


@contextlib.contextmanager
def load(processes: int) -> Iterator[None]:
    """``processes`` busy loops beside the experiments, stopped on every way out."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(processes)]
    try:
        yield
    finally:
        for p in busy:
            p.kill()
            p.wait()


@contextlib.contextmanager
def _lab_stopped(env: dict[str, str]) -> Iterator[None]:
    try:
        yield
    finally:
        subprocess.run([LABKIT, "down"], env=env, capture_output=True, timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the runs")
    parser.add_argument("--only", action="append", choices=[e.name for e in EXPERIMENTS],
                        help="this experiment only (repeatable)")
    parser.add_argument("--hang-after", type=float, default=HANG_S)
    args = parser.parse_args()
    chosen = [e for e in EXPERIMENTS if not args.only or e.name in args.only]
    print(f"{args.runs} runs each, {args.load} busy processes beside them, a run still going "
          f"after {args.hang_after:.0f} s counts as a hang", flush=True)
    rows = []
    # The experiments on the lab cluster start one (`labkit up`'s) if none runs: a home of
    # their own, stopped at the end, so no broker outlives the benchmark.
    home = tempfile.mkdtemp(prefix="labkit-stress-")
    env = {**os.environ, "LABKIT_HOME": home}
    with load(args.load), _lab_stopped(env):
        for experiment in chosen:
            tally = Tally()
            for i in range(args.runs):
                outcome, took, out = run_once(experiment, args.hang_after, env)
                print(f"{experiment.name} run {i + 1}/{args.runs}: {outcome} in {took:.0f} s",
                      file=sys.stderr, flush=True)
                if outcome == "ok":
                    tally.durations.append(took)
                else:
                    tally.hangs += outcome == "hung"
                    tally.failures += outcome == "failed"
                    print(f"--- {experiment.name} run {i + 1} ({outcome}; promised: "
                          f"{experiment.promise}):\n{out[-4000:]}", file=sys.stderr, flush=True)
            rows.append(tally.row(experiment.name, args.runs))
            print(rows[-1], flush=True)
    print("\n| experiment | runs | hangs | failures | p50 s | p95 s | max s |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
