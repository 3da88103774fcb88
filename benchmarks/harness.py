"""The torture harness's cost per kill-restart cycle, for a Python app and for a JVM app.

    LABKIT_HOME=/tmp/torture-lab labkit up && LABKIT_HOME=/tmp/torture-lab python benchmarks/harness.py [NAME...]

(NAME: only the rows whose app name contains it, e.g. ``Streams``.)

Each app runs the same input with the same seed twice: without kills and with K kills.
``(whole run with K kills - whole run without) / K`` is what one kill-restart cycle costs
end to end (the harness's SIGKILL and respawn, the app's start, its recovery: fencing,
aborting the open transaction, fetching offsets, redoing the aborted batch). The harness's
own part, SIGKILL of the process group sent to the new process running, is measured
separately (``restart_s``).
"""
from __future__ import annotations

import statistics
import sys

from labkit.torture import apps, harness
from labkit.paths import project_root

APPS = project_root() / "examples" / "torture"
# Kafka Streams' running count is judged by its counts, and killed between two of its
# commits (as in tests/test_harness_streams.py) so that every kill interrupts work.
STREAMS = {"check": "counts", "kill_clock": "commit", "kill_after": (0.5, 1.0)}
RUNS = {  # name -> (command, input records, kills, more torture options)
    "Python (exactly_once_app.py --work-ms 5)":
        ([sys.executable, str(APPS / "exactly_once_app.py"), "--work-ms", "5"], 600, 3, {}),
    "JVM (Kafka's TransactionalMessageCopier)": (apps.copier_command(), 10_000, 8, {}),
    **{f"JVM (Kafka Streams, StreamsRunningCount.java {g})": (apps.streams_command(g), 2400, 3,
                                                          STREAMS)
       for g in apps.STREAMS_GUARANTEES},
}


def main() -> None:
    print("| app | input | kills | run without kills s | run with kills s | cost per cycle s "
          "| harness kill-to-respawn ms (median) | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    only = sys.argv[1:]
    for name, (command, records, kills, options) in RUNS.items():
        if only and not any(word in name for word in only):
            continue
        calm = harness.torture(command, records=records, kills=0, seed=1, timeout=300, **options)
        tortured = harness.torture(command, records=records, kills=kills, seed=1, timeout=300,
                                   **options)
        per_cycle = (tortured.seconds - calm.seconds) / max(tortured.kills, 1)
        respawn_ms = statistics.median(tortured.restart_s) * 1000
        print(f"| {name} | {records} | {tortured.kills} | {calm.seconds:.1f} | "
              f"{tortured.seconds:.1f} | {per_cycle:.2f} | {respawn_ms:.1f} | "
              f"{tortured.verdict} |", flush=True)


if __name__ == "__main__":
    main()
