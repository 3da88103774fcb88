"""The judge's coordinator phase again and again, under load, with the cluster watched
(issue 48: a right loop called "lost" after both coordinator kills in 2 of 8 fresh clones).

    python benchmarks/judge_coordinator_load.py                    # 6 runs, 2 at once, 2 busy
    python benchmarks/judge_coordinator_load.py --runs 3 --parallel 1 --load 0

Each process starts a failure lab of its own (a controller and brokers 1-3) and runs
``experiments.run("judge-coordinator", seed=...)`` on it ``--runs`` times, while a thread
asks the cluster's metadata every 0.3 s which partitions have replicas out of sync. Per run
it prints: exact or not and its seconds, the windows with replicas out of sync, the kills and
restarts, and the gaps of more than 3 s between the loop's progress samples (seconds since
the run's first event). A run that is not exact prints its summary and its history's
timeline. ``--load N`` busy processes run beside. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import AdminClient  # noqa: E402

from labkit import experiments  # noqa: E402
from labkit.checking import timeline as timelines  # noqa: E402
from labkit.kafka.failure_lab import failure_lab  # noqa: E402


def _busy() -> None:
    while True:
        pass


def _out_of_sync(admin: AdminClient) -> int:
    topics = admin.list_topics(timeout=2).topics
    return sum(p.leader < 0 or len(p.isrs) < len(p.replicas)
               for meta in topics.values() for p in meta.partitions.values())


def _windows(samples: list[tuple[float, int]], start: float) -> list[tuple[float, float]]:
    windows, since = [], None
    for t, short in samples:
        if short and since is None:
            since = t
        elif not short and since is not None:
            windows.append((round(since - start, 1), round(t - start, 1)))
            since = None
    return windows + ([(round(since - start, 1), None)] if since is not None else [])


def _runs(tag: str, runs: int, first_seed: int) -> None:
    with failure_lab(announce=lambda _: None) as lab:
        admin = AdminClient({"bootstrap.servers": lab.bootstrap, "log_level": 0})
        samples: list[tuple[float, int]] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.3):
                try:
                    samples.append((time.time(), _out_of_sync(admin)))
                except Exception:  # a broker restarting: no answer this time
                    pass
        threading.Thread(target=watch, daemon=True).start()
        for n in range(runs):
            samples.clear()
            began = time.monotonic()
            run = experiments.run("judge-coordinator", cluster=lab, seed=first_seed + n)
            exact = run.report.exactly_once and not run.findings
            events = list(run.history)
            start = events[0]["t"]
            faults = [(round(e["t"] - start, 1), e["kind"]) for e in events
                      if e["kind"] in ("broker-killed", "broker-restarted")]
            progress = [(e["t"] - start, e["committed"]) for e in events
                        if e["kind"] == "progress"]
            gaps = [(round(a, 1), round(b, 1), c) for (a, c), (b, _) in
                    zip(progress, progress[1:]) if b - a > 3]
            print(f"{tag} run {n}: {'exact' if exact else 'NOT EXACT'} in "
                  f"{time.monotonic() - began:.0f} s; out of sync {_windows(samples, start)}; "
                  f"faults {faults}; progress gaps {gaps}", flush=True)
            if not exact:
                print(run.summary(), timelines.text(events), sep="\n", flush=True)
        stop.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per process")
    parser.add_argument("--parallel", type=int, default=2, help="processes, each a lab")
    parser.add_argument("--load", type=int, default=2, help="busy processes beside")
    a = parser.parse_args()
    busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(a.load)]
    for p in busy:
        p.start()
    try:
        workers = [multiprocessing.Process(target=_runs, args=(f"p{i}", a.runs, 1 + i * a.runs))
                   for i in range(a.parallel)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        for p in busy:
            p.terminate()


if __name__ == "__main__":
    main()
