"""Notebook 12's three apps under the notebook's torture, N runs each: the app of section 2
(commit before the flush), the exercise's starting point (commit after it) and the
documented solution (output and offsets in one transaction).

    LABKIT_HOME=/tmp/own-lab labkit up && LABKIT_HOME=/tmp/own-lab python benchmarks/own_pipeline.py [RUNS]

Each app is the function its notebook cell defines (the solution: the exercise cell with
notebooks/solutions/12_your_own_pipeline.md's code after it, as the solved notebook runs),
run by ``own_pipeline.torture_function`` exactly as the notebook and the check run it
(``own_pipeline.TORTURE``: 600 records, 3 kills, each 0.5-1.5 s after the app's first offset
commit since its last start). Prints one row per app: lost, duplicated and aborted records
in the log over the runs, and the verdicts.
"""
from __future__ import annotations

import sys
import tempfile
from collections import Counter

from labkit.exercises import own_pipeline
from tests.notebook_cells import as_cell, exercise_function, read

NOTEBOOK = "12_your_own_pipeline"


def apps() -> dict[str, object]:
    (shown,) = [c.source for c in read(NOTEBOOK).cells
                if c.cell_type == "code" and "def my_app(" in c.source]
    return {"commit before the flush (section 2's my_app)": as_cell(shown, "my_app"),
            "commit after the flush (the exercise's start)": exercise_function(NOTEBOOK,
                                                                                "my_fixed_app"),
            "offsets in the transaction (the solution)": exercise_function(NOTEBOOK,
                                                                           "my_fixed_app", True)}


def span(values: list[int]) -> str:
    return f"{min(values)}-{max(values)}" if min(values) != max(values) else str(values[0])


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print("| app | runs | lost | duplicated | aborted in the log | verdicts |")
    print("|---|---|---|---|---|---|")
    for name, app in apps().items():
        results = []
        with tempfile.TemporaryDirectory(prefix="own-pipeline-bench-") as directory:
            for _ in range(runs):
                results.append(own_pipeline.torture_function(app, directory))
        reports = [r.report for r in results]
        verdicts = Counter(r.verdict for r in results)
        print(f"| {name} | {runs} | {span([r.lost for r in reports])} | "
              f"{span([r.duplicated for r in reports])} | "
              f"{span([r.aborted_in_log for r in reports])} | "
              + ", ".join(f"{v} ({n} of {runs})" for v, n in verdicts.items()) + " |",
              flush=True)


if __name__ == "__main__":
    main()
