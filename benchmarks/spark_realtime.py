"""Spark's real-time mode against a micro-batch trigger: latency, and what one driver crash
writes twice, for several batch durations (issue 30). Each row is one run of the
`spark-realtime` experiment (labkit/spark/realtime.py): payments at `rate` a second, the
lab's copy query under the trigger, its driver SIGKILLed `kill-after` seconds after its first
checkpoint and restarted on the checkpoint, the output audited.

    python benchmarks/spark_realtime.py                    # a lab of its own, or LABKIT_BOOTSTRAP
    python benchmarks/spark_realtime.py --kill-after 2.5 7 --repeats 2

Prints markdown rows for docs/measurements.md. One crash per row: its duplicates are one
sample of the replay window, shown beside how long the killed driver had run since its last
checkpoint.
"""
from __future__ import annotations

import argparse

from labkit import experiments
from labkit.kafka import cluster
from labkit.spark import runner
from labkit.spark.realtime import MICRO_BATCH

TRIGGERS = (MICRO_BATCH, "5 seconds", "10 seconds", "20 seconds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="payments a second")
    parser.add_argument("--kill-after", type=float, nargs="*", default=[2.5],
                        help="seconds after the first checkpoint when the driver is SIGKILLed")
    parser.add_argument("--triggers", nargs="*", default=list(TRIGGERS))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    lab = cluster.ensure()
    runner.warm_up()
    print("| trigger | kill after the first checkpoint | killed, s after the last checkpoint "
          "| payments | written twice | lost | latency p50 / p99 ms | after a dedupe by id |")
    print("|---|---|---|---|---|---|---|---|")
    for trigger in args.triggers:
        for kill_after in args.kill_after:
            for _ in range(args.repeats):
                run = experiments.run("spark-realtime", cluster=lab.bootstrap, trigger=trigger,
                                      rate=args.rate, kill_after=kill_after, spare=True,
                                      keep_topics=False)
                r = run.report
                print(f"| {trigger} | {kill_after:g} s | {run.killed_after_checkpoint_s} | "
                      f"{r.produced} | {r.duplicated} | {r.lost} | {run.latency['p50_ms']:.0f} "
                      f"/ {run.latency['p99_ms']:.0f} | {run.deduped.verdict} |", flush=True)
    runner.close_workers()


if __name__ == "__main__":
    main()
