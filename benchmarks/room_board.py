"""The room board under a room: N simulated learners publish exercise results for a while;
measures how long a result takes to show in the board's /state (what the page fetches every
second; the page adds up to 1 s) and the board process's CPU.

    LABKIT_HOME=/tmp/board-lab .venv/bin/labkit up
    LABKIT_HOME=/tmp/board-lab .venv/bin/python benchmarks/room_board.py [learners] [seconds]

Each learner is a process of its own (its own namespace) calling labkit.room.board.publish_verdict,
the path every exercise check takes, every 1-3 s; the poller reads /state every 50 ms.
Results: docs/measurements.md ("The room board").
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid

import psutil

from labkit.kafka import cluster
from labkit.kafka.ports import free_port

LEARNER = """
import random, sys, time
from labkit.room.board import publish_verdict
n, until = int(sys.argv[1]), float(sys.argv[2])
rng = random.Random(n)
i = 0
while time.time() < until:
    publish_verdict(f"0{i % 8}_nb", "", rng.random() < 0.4, f"try {i}")
    i += 1
    time.sleep(rng.uniform(1, 3))
"""


def main(learners: int = 30, seconds: float = 30.0) -> None:
    bootstrap = cluster.running_or_fail().bootstrap
    room, port = f"bench-{uuid.uuid4().hex[:6]}", free_port()
    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap}
    board = subprocess.Popen([sys.executable, "-c", "from labkit.cli import app; app()", "room",
                              "board", "--room", room, "--port", str(port)], env=env,
                             stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/state"
    procs = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).read()
                break
            except OSError:  # not up yet; a board that died or never answers ends the run
                if board.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the board did not start: run `labkit room board` by hand to see why")
                time.sleep(0.2)
        cpu_before = psutil.Process(board.pid).cpu_times()
        until = time.time() + seconds
        procs = [subprocess.Popen([sys.executable, "-c", LEARNER, str(n), str(until)],
                                  env={**env, "LABKIT_ROOM": room, "LABKIT_NAMESPACE": f"learner{n:02d}"})
                 for n in range(learners)]
        seen: dict[tuple[str, str], float] = {}
        delays: list[float] = []
        started = time.monotonic()
        while time.time() < until + 3:
            state = json.loads(urllib.request.urlopen(url, timeout=5).read())
            now = time.time()
            for who, row in state["learners"].items():
                for key, cell in row.items():
                    if seen.get((who, key)) != cell["t"]:
                        seen[(who, key)] = cell["t"]
                        delays.append(now - cell["t"])  # the record's own publish time
            time.sleep(0.05)
        wall = time.monotonic() - started
        cpu_after = psutil.Process(board.pid).cpu_times()
        cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
        delays.sort()
        print(f"learners {learners}, {seconds:.0f} s: {len(delays)} results seen on the board; "
              f"delay from publish to /state: median {statistics.median(delays) * 1000:.0f} ms, "
              f"p95 {delays[int(len(delays) * 0.95)] * 1000:.0f} ms, max {delays[-1] * 1000:.0f} ms; "
              f"board CPU {cpu:.2f} s over {wall:.0f} s ({100 * cpu / wall:.1f} % of one core); "
              f"load average {os.getloadavg()[0]:.1f}")
    finally:
        for p in procs:
            p.kill()
        board.terminate()
        board.wait(10)


if __name__ == "__main__":
    main(*(int(a) if i == 0 else float(a) for i, a in enumerate(sys.argv[1:])))
