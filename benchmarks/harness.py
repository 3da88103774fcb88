"""The torture harness's cost per kill-restart cycle, for a Python app and for a JVM app.

    LABKIT_HOME=/tmp/torture-lab labkit up && LABKIT_HOME=/tmp/torture-lab python benchmarks/harness.py

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

from labkit import harness
from labkit.paths import project_root

APPS = project_root() / "examples" / "torture"
RUNS = {  # name -> (command, input records, kills)
    "Python (exactly_once_app.py --work-ms 5)":
        ([sys.executable, str(APPS / "exactly_once_app.py"), "--work-ms", "5"], 600, 3),
    "JVM (Kafka's TransactionalMessageCopier)": (harness.copier_command(), 10_000, 8),
}


def main() -> None:
    print("| app | input | kills | run without kills s | run with kills s | cost per cycle s "
          "| harness kill-to-respawn ms (median) | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (command, records, kills) in RUNS.items():
        calm = harness.torture(command, input=records, kills=0, seed=1, timeout_s=300)
        tortured = harness.torture(command, input=records, kills=kills, seed=1, timeout_s=300)
        per_cycle = (tortured.seconds - calm.seconds) / max(tortured.kills, 1)
        respawn_ms = statistics.median(tortured.restart_s) * 1000
        print(f"| {name} | {records} | {tortured.kills} | {calm.seconds:.1f} | "
              f"{tortured.seconds:.1f} | {per_cycle:.2f} | {respawn_ms:.1f} | "
              f"{tortured.verdict} |", flush=True)


if __name__ == "__main__":
    main()
