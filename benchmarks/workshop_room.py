"""The workshop path with a room on one broker: N learners run the path's cells at once.

    LABKIT_HOME=/tmp/room-lab .venv/bin/labkit up
    LABKIT_HOME=/tmp/room-lab .venv/bin/python benchmarks/workshop_room.py --learners 10
    LABKIT_HOME=/tmp/room-lab .venv/bin/python benchmarks/workshop_room.py --learners 1
    LABKIT_HOME=/tmp/room-lab .venv/bin/python benchmarks/workshop_room.py --stops 5,6
    LABKIT_HOME=/tmp/room-lab .venv/bin/python benchmarks/workshop_room.py --stops 6 --solved

Reads the path from docs/workshop.md ("## The path": each stop's notebook and the sections
it takes). Each learner is a process of its own with a namespace of its own
(LABKIT_NAMESPACE=learnerNN) against the one running broker (LABKIT_BOOTSTRAP), as in a
room; all start at the first stop together, as when an instructor says "run it now". For
each stop a learner executes, in a fresh kernel, the code cells of the notebook's opening and
of the sections taken, in order (a section the path skips is not run, so a stop that needs
it fails here). Prints, per stop, the cells' seconds over the learners (median and slowest)
as markdown rows for docs/workshop.md and docs/measurements.md. ``--solved``: each exercise
cell holds its documented solution (notebooks/solutions), so the capstone's stop runs a right
loop's whole verdict for every learner at once; the verdict's own seconds (from the cell that
calls ``run_capstone`` starting to the one that calls ``check_capstone`` ending) are printed
beside the stop's.

On one 2-core machine the learners also share the CPU, which a room of laptops does not:
the times are an upper bound on what one broker shared by N learners costs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.solution_code import solution_codes  # noqa: E402
from tests.test_navigation import taken  # noqa: E402 - the path's sections, read as the test reads them

LEARNER = """
import json, sys, time
from datetime import datetime
import nbformat
from nbclient import NotebookClient
stops = json.loads(sys.argv[1])
out = []

def verdict_s(nb):
    # the capstone's verdict: from run_capstone's cell starting to check_capstone's ending
    def at(cell, key):
        return datetime.fromisoformat(cell.metadata["execution"][key].replace("Z", "+00:00"))
    runs = [c for c in nb.cells if "run_capstone(" in c.source]
    checks = [c for c in nb.cells if "check_capstone(" in c.source]
    if not runs or not checks or "shell.execute_reply" not in checks[-1].metadata.get("execution", {}):
        return None
    return round((at(checks[-1], "shell.execute_reply") - at(runs[-1], "iopub.execute_input")).total_seconds(), 1)

for stop in stops:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in stop["cells"]])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    started = time.monotonic()
    error = None
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": stop["dir"]}}).execute()
    except Exception as exc:  # a failed cell: report it, go on with the next stop
        error = f"{type(exc).__name__}: {str(exc)[-300:]}"
    out.append({"notebook": stop["notebook"], "seconds": round(time.monotonic() - started, 1),
                "verdict": verdict_s(nb), "error": error})
print(json.dumps(out))
"""


def path_stops() -> list[tuple[str, list[str]]]:
    """(notebook name, sections taken) per stop of docs/workshop.md's path."""
    text = (ROOT / "docs" / "workshop.md").read_text()
    section = text.split("## The path")[1].split("\n## ")[0]
    stops = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or not cells[0].isdigit():
            continue
        name = re.search(r"notebooks/([^)]+)\.ipynb", cells[1]).group(1)
        stops.append((name, taken(cells[2])))
    return stops


def code_cells(name: str, sections: list[str], solved: bool = False) -> list[str]:
    """The code cells of the notebook's opening and of ``sections``, in order (``solved``:
    each exercise cell replaced by its documented solution)."""
    nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    current, cells = "opening", []
    solutions = iter(solution_codes(name) if solved else [])
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            for heading in re.findall(r"(?m)^## (.+)$", source):
                number = re.match(r"(\d+)\. ", heading)
                current = number.group(1) if number else heading.strip()
        elif current == "opening" or current in sections:
            exercise = solved and source.lstrip().startswith("# EXERCISE")
            cells.append(next(solutions) if exercise else source)
    if solved and "check_capstone" in cells[-1]:  # a right loop: its verdict must pass
        cells.append('assert "Well done" in str(_), _')
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=int, default=10)
    parser.add_argument("--stops", default="", help="only these stops, e.g. 5,6 (default: all)")
    parser.add_argument("--solved", action="store_true",
                        help="every exercise cell holds its documented solution")
    args = parser.parse_args()
    from labkit.kafka import cluster

    bootstrap = cluster.running_or_fail().bootstrap
    wanted = {int(n) for n in args.stops.split(",") if n.strip()}
    stops = [{"stop": n, "notebook": name, "cells": code_cells(name, sections, args.solved),
              "dir": str(ROOT / "notebooks")}
             for n, (name, sections) in enumerate(path_stops(), 1) if not wanted or n in wanted]
    procs = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(1, args.learners + 1):
            env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap,
                   "LABKIT_NAMESPACE": f"learner{n:02d}", "LABKIT_HOME": f"{tmp}/home-{n}"}
            Path(env["LABKIT_HOME"]).mkdir()
            procs.append(subprocess.Popen([sys.executable, "-c", LEARNER, json.dumps(stops)],
                                          env=env, stdout=subprocess.PIPE, text=True,
                                          stderr=subprocess.DEVNULL))
        results = []
        for n, proc in enumerate(procs, 1):
            out, _ = proc.communicate(timeout=3600)
            print(f"learner {n} done after {time.monotonic() - started:.0f} s", file=sys.stderr)
            results.append(json.loads(out.strip().splitlines()[-1]))
    print("| stop | notebook | learners | cells s, median | cells s, slowest | failed |")
    print("|---|---|---|---|---|---|")
    for i, stop in enumerate(stops):
        times = [r[i]["seconds"] for r in results]
        failed = [f"learner{n:02d}: {r[i]['error']}" for n, r in enumerate(results, 1)
                  if r[i]["error"]]
        print(f"| {stop['stop']} | {stop['notebook']} | {args.learners} | {statistics.median(times):.0f} | "
              f"{max(times):.0f} | {len(failed)} |")
        for line in failed[:3]:
            print(f"  {line}", file=sys.stderr)
        verdicts = [r[i]["verdict"] for r in results if r[i].get("verdict") is not None]
        if verdicts:
            print(f"  stop {stop['stop']}'s verdict (run_capstone's cell to check_capstone's): "
                  f"{statistics.median(verdicts):.0f} s median, {max(verdicts):.0f} s slowest",
                  file=sys.stderr)
    print(f"whole path, wall: {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
