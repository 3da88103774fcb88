"""Notebook 09's call with the reader that waited out consume()'s 50 ms window (before
1943fbf) and the one that stamps a record when it arrives, alternating run by run: how
close does another guarantee come to the transactional one's p50 in a latency round?

    LABKIT_HOME=/tmp/lat-lab .venv/bin/labkit up
    LABKIT_HOME=/tmp/lat-lab .venv/bin/python benchmarks/latency_reader.py --runs 30

Run it while something loads the machine (stop 68 ran it beside a fresh clone's
`.ci/run`). Per run it prints each latency round's p50s and the largest ratio of another
guarantee's p50 to the transactional one's; at the end, per reader, the rounds where that
ratio reached 1 (another guarantee looked at least as slow).
"""
from __future__ import annotations

import argparse
import time

from labkit.cost import bench, findings, lane
from labkit.kafka import cluster


def transactional_loop(producer, topic, values, commit_every_ms):  # notebook 09's
    producer.begin_transaction()
    opened = time.monotonic()
    for value in values:
        if (time.monotonic() - opened) * 1000 >= commit_every_ms:
            producer.commit_transaction(30)
            producer.begin_transaction()
            opened = time.monotonic()
        producer.produce(topic, value=value)
        producer.poll(0)
    producer.commit_transaction(30)


READERS = {"consume-50ms": lambda reader: reader.consumer.consume(1000, timeout=0.05),
           "on-arrival": lane._Reader._arrived}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    lab = cluster.ensure()
    rounds = {name: [0, 0, 0.0] for name in READERS}  # rounds, inverted, largest ratio
    for n in range(args.runs):
        name = list(READERS)[n % len(READERS)]
        lane._Reader._arrived = READERS[name]
        runs = bench.compare_guarantees(lab.bootstrap, records=30_000, value_bytes=1024,
                                        repeats=7, latency_records=300, latency_repeats=3,
                                        transactional_loop=transactional_loop)
        p50 = runs[runs["mode"] == "latency"].pivot(index="repeat", columns="guarantee",
                                                    values="latency_p50_ms")
        ratio = p50.drop(columns="transactional").max(axis=1) / p50["transactional"]
        seen = rounds[name]
        seen[0] += len(ratio)
        seen[1] += int((ratio >= 1).sum())
        seen[2] = max(seen[2], float(ratio.max()))
        slowest = findings.conclude(findings.summarize(runs)).slowest_to_read
        print(f"run {n} ({name}): largest ratio {ratio.max():.2f}, slowest {slowest}")
        print(p50.round(1).to_string(), flush=True)
    for name, (count, inverted, largest) in rounds.items():
        print(f"{name}: {inverted} of {count} rounds inverted, largest ratio {largest:.2f}")
    lane._Reader._arrived = READERS["on-arrival"]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
