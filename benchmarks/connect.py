"""Kafka Connect and Debezium: how long a worker takes to start and to come back after a
SIGKILL, and what one kill of a worker streaming an outbox costs, at-least-once against
exactly-once (issue 42).

    python benchmarks/connect.py                    # a lab of its own, or LABKIT_BOOTSTRAP
    python benchmarks/connect.py --starts 5 --repeats 3 --interval-ms 5000 60000

Starts: a fresh worker (its own group and topics) started, SIGKILLed, started again,
stopped, ``--starts`` times. Kills: the ``outbox`` experiment with no commit point of its
own (``first=0``): the service writes ``--events`` payments at ``--rate`` a second, the
worker (offsets written / transactions committed every ``--interval-ms``) is SIGKILLed once
``--kill-after`` of them are in the topic, restarted, and the topic is audited. With the
periodic commits the kill lands anywhere in the interval: the duplicates of one kill are
what the worker had sent since its last commit. Prints markdown rows for
docs/measurements.md. PostgreSQL: the lab's (``labkit.storage.postgres.ensure``: LABKIT_PG_DSN,
or the running lab's server, or one of its own for the run).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit.kafka import cluster, topics  # noqa: E402
from labkit.kafka.connect import ConnectWorker, workers_left  # noqa: E402
from labkit import experiments  # noqa: E402


def starts(bootstrap: str, n: int, home: Path) -> None:
    print("| start | first start, s | SIGKILL to ready again, s | clean stop, s |")
    print("|---|---|---|---|")
    for i in range(n):
        worker = ConnectWorker(bootstrap, f"bench-{uuid.uuid4().hex[:8]}", home=home / str(i))
        try:
            worker.start()
            first = worker.startup_s
            killed = time.monotonic()
            worker.kill()
            worker.start()
            again = time.monotonic() - killed
            stopping = time.monotonic()
            worker.stop()
            print(f"| {i + 1} | {first:.1f} | {again:.1f} | {time.monotonic() - stopping:.1f} |",
                  flush=True)
        finally:
            worker.kill()
            topics.delete(bootstrap, worker.names.configs, worker.names.offsets,
                          worker.names.statuses)


def kills(bootstrap: str, args: argparse.Namespace) -> None:
    print("| worker | commit interval | killed after (in the topic) | sent by the killed worker "
          "| offsets records stored at the kill | duplicated | lost | aborted in the log "
          "| SIGKILL to ready, s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for interval in args.interval_ms:
        for exactly_once in (False, True):
            for kill_after in args.kill_after:
                for _ in range(args.repeats):
                    run = experiments.run("outbox", cluster=bootstrap,
                                          exactly_once=exactly_once, first=0,
                                          second=args.events, rate=args.rate,
                                          kill_after=kill_after, commit_interval_ms=interval)
                    r = run.report
                    print(f"| {'exactly-once' if exactly_once else 'at-least-once'} "
                          f"| {interval / 1000:g} s | {kill_after} | {len(run.sent_by_killed)} "
                          f"| {len(run.stored_at_kill)} | {r.duplicated} | {r.lost} "
                          f"| {r.aborted_in_log} | {run.restart_s:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5, help="worker starts to time")
    parser.add_argument("--events", type=int, default=1500)
    parser.add_argument("--rate", type=float, default=100.0, help="payments a second")
    parser.add_argument("--kill-after", type=int, nargs="*", default=[300, 700, 1100])
    parser.add_argument("--interval-ms", type=int, nargs="*", default=[5000])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    lab = cluster.ensure()
    with tempfile.TemporaryDirectory(prefix="bench-connect-") as where:
        home = Path(where)
        if args.starts:
            starts(lab.bootstrap, args.starts, home)
        if args.kill_after:
            kills(lab.bootstrap, args)
        assert workers_left(home) == []


if __name__ == "__main__":
    main()
