"""The Java loop under the judge's zombie phase: where it takes the offsets and the group
metadata it commits decides whether a woken zombie's batch is written twice.

    python benchmarks/java_zombie.py                         # 10 runs of each loop, KIP-848
    python benchmarks/java_zombie.py --runs 5 --group-protocol classic

Two loops, each judged ``--runs`` times under ``phase="zombie"`` (an instance frozen until
the group moved its partitions on, then woken): the lab's (examples/java_loop/
ProductionLoop.java, the positions and ``groupMetadata()`` taken right after ``poll()``) and
the same file asking for both at the commit instead. Under KIP-848, kafka-clients rejoins a
fenced member on its background thread, so the second loop's late request carries the new
member epoch and the coordinator accepts the zombie's offsets. Prints one line per run, then
a markdown row per loop for docs/measurements.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from labkit import experiments  # noqa: E402
from labkit.pipelines import java_loop  # noqa: E402

AT_COMMIT = {  # the edits that move both reads from the batch to the commit
    "                Map<TopicPartition, OffsetAndMetadata> next = positions(consumer);\n": "",
    "                ConsumerGroupMetadata member = consumer.groupMetadata();\n": "",
    "                    producer.sendOffsetsToTransaction(next, member);  // as the batch was read\n":
        "                    producer.sendOffsetsToTransaction(positions(consumer), "
        "consumer.groupMetadata());\n",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--group-protocol", default="consumer", choices=("classic", "consumer"))
    args = parser.parse_args()
    loops = {"with the batch (the lab's)": java_loop.reference(),
             "at the commit": java_loop.reference().edited("AtCommitLoop", AT_COMMIT)}
    rows = []
    for label, loop in loops.items():
        exact, duplicated, raised = 0, [], []
        for i in range(args.runs):
            started = time.monotonic()
            run = experiments.run("judge", pipeline=loop, phase="zombie",
                                  group_protocol=args.group_protocol, announce=lambda line: None)
            exact += run.report.exactly_once and not run.findings
            duplicated.append(run.report.duplicated)
            raised += [e["raised"][:60] for e in run.errors]
            print(f"{label} {i}: {run.verdict}, {run.report.duplicated} duplicated, "
                  f"findings {run.findings or 'none'}, {time.monotonic() - started:.0f} s",
                  flush=True)
        rows.append(f"| {label} | {args.group_protocol} | {exact} of {args.runs} | "
                    f"{sum(d > 0 for d in duplicated)} ({max(duplicated)} at most) | "
                    f"{'; '.join(sorted(set(raised))) or 'none'} |")
    print("| loop | protocol | exact | runs with duplicates | raised |\n|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
