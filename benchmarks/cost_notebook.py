"""Notebook 09 run N times in a row: does its printed conclusion agree with its own table,
and do the statements the notebook tests compare come out the same every time?

    LABKIT_HOME=/tmp/cost-lab .venv/bin/labkit up
    LABKIT_HOME=/tmp/cost-lab .venv/bin/python benchmarks/cost_notebook.py 5 [--save]

Each run executes a copy of notebooks/09_cost.ipynb (a fresh kernel, the lab broker) with
one cell added at the end that hands this script the run's tables as JSON. The script then
re-derives, with its own code (not ``findings.conclude``), what the tables say (fastest
guarantee by median, each guarantee's verdict from the quartiles of its paired rounds, the
longest median latency, the commit-wait ordering of the grid, where each published figure
lies) and checks every printed statement against it, and checks that each compared cell's
output equals the committed notebook's. One line per run, in Markdown, for
docs/measurements.md: load average at the start, wall time, the cells' time, the printed
verdicts and a few of the numbers behind them, agreement; then, run by run, the published
shape's verdicts and each cell's median change against at_least_once in throughput and in
CPU (client, broker), with how far apart the runs were. ``--save`` stores the last run's
outputs as the notebook's (when every run agreed), so its tables are a recorded run's.
"""
from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pandas as pd
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "09_cost.ipynb"
sys.path.insert(0, str(ROOT))
from tests.notebook_cells import compared_text, is_compared  # noqa: E402

DUMP = """import json as _json
print("TABLES-JSON" + _json.dumps({
    "summary": summary.reset_index().to_json(orient="records"),
    "grid": grid_table.reset_index().to_json(orient="records"),
    "wire": wire.to_json(orient="records"),
    "shape": published.shape(grid, summary)[["throughput says", "CPU says"]].agg(" / ".join, axis=1).to_dict(),
    "versus_amo": versus_at_most_once.reset_index().to_json(orient="records")}))"""
# What the spread table compares across runs: each cell's median against at_least_once
RATIOS = {"throughput": "throughput_vs_baseline_pct", "client CPU": "client_cpu_vs_baseline_pct",
          "broker CPU": "broker_cpu_vs_baseline_pct"}
WITHIN_POINTS = 5.0  # the aim: each cell's ratio within +-5 percentage points across runs


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream"
                   and o.name == "stdout")


def _cell(nb, marker: str):
    found = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    assert len(found) == 1, marker
    return found[0]


def verdict(q1: float, q3: float) -> str:
    return "slower" if q3 < 0 else "faster" if q1 > 0 else "no difference beyond the spread"


def check_run(nb) -> tuple[dict, list[str]]:
    """What the run printed and every disagreement with its own tables."""
    tables = json.loads(_text(nb.cells[-1]).split("TABLES-JSON", 1)[1])
    summary = pd.read_json(io.StringIO(tables["summary"])).set_index("guarantee")
    grid = pd.read_json(io.StringIO(tables["grid"]))
    printed = _text(_cell(nb, "print(conclusion)"))
    problems = []
    fastest = summary["records_per_s"].idxmax()
    if not printed.startswith(f"fastest: {fastest} "):
        problems.append(f"fastest printed {printed.split(' ')[1]!r}, table says {fastest}")
    verdicts = {}
    for name, row in summary.iterrows():
        if name == "at_least_once":
            continue
        verdicts[name] = verdict(row["vs_baseline_pct_q1"], row["vs_baseline_pct_q3"])
        line = (f"{name} vs at_least_once: {row['throughput_vs_baseline_pct']:+.1f} % throughput "
                f"(middle half of the rounds {row['vs_baseline_pct_q1']:+.1f} to "
                f"{row['vs_baseline_pct_q3']:+.1f} %): {verdicts[name]}")
        if line not in printed:
            problems.append(f"missing or different: {line}")
    slowest = summary["latency_p50_ms"].idxmax()
    stable = _text(_cell(nb, "longest median wait for a read_committed reader"))
    if stable.strip() != f"longest median wait for a read_committed reader: {slowest}":
        problems.append(f"latency statement {stable.strip()!r}, table says {slowest}")
    txn = grid[grid["commit_wait_pct"].notna()].copy()
    txn["interval"] = txn["config"].str.extract(r"@([\d.]+)ms")[0].astype(float)
    falls = all(g.sort_values("interval")["commit_wait_pct"].is_monotonic_decreasing
                and g["commit_wait_pct"].nunique() == len(g) for _, g in txn.groupby("value_bytes"))
    grid_line = _text(_cell(nb, "findings.commit_wait_falls_with_interval(grid_table)"))
    if not grid_line.strip().endswith("yes" if falls else "no"):
        problems.append(f"commit-wait statement {grid_line.strip()!r}, table says {falls}")
    # each compared cell shows what the committed notebook shows (what nbval checks)
    committed = nbformat.read(NOTEBOOK, as_version=4)
    for ref, new in zip([c for c in committed.cells if c.cell_type == "code"],
                        [c for c in nb.cells if c.cell_type == "code"]):
        if is_compared(ref) and "EXERCISE" not in ref.source:
            a, b = (re.sub(r"127\.0\.0\.1:\d+", "BOOTSTRAP", compared_text(c)) for c in (ref, new))
            if a != b:
                problems.append(f"compared cell differs: {ref.source.splitlines()[0]!r}: {b!r}")
    wire = pd.read_json(io.StringIO(tables["wire"]))
    txn = wire[wire["transactions"] > 0]
    one_each = bool(len(txn)) and bool(
        ((txn["requests_EndTxn"] == txn["transactions"]) & (txn["requests_AddPartitionsToTxn"]
         - txn["add_partitions_refused"] == txn["transactions"])).all())
    wire_line = _text(_cell(nb, "cost_units.one_of_each_per_commit(wire)"))
    if not wire_line.strip().endswith("yes" if one_each else "no"):
        problems.append(f"wire statement {wire_line.strip()!r}, table says {one_each}")
    ratios = {}
    for name, row in summary.iterrows():
        ratios[name] = {k: row.get(c) for k, c in RATIOS.items()}
    for _, row in grid.iterrows():
        ratios[f"{row['value_bytes']} B {row['config']}"] = {k: row.get(c) for k, c in RATIOS.items()}
    x = summary.loc["transactional"]
    others = summary.drop(index="transactional")["latency_p50_ms"]
    cell = grid[(grid["value_bytes"] == 1024) & (grid["config"] == "transactional@100ms")].iloc[0]
    return {"fastest": fastest, "verdicts": verdicts, "ratios": ratios, "shape": tables["shape"],
            "refused_per_commit": round(float(txn["add_partitions_refused"].sum()
                                              / txn["transactions"].sum()), 2), "slowest_to_read": slowest,
            "commit_wait_falls": falls,
            "p50": f"{x['latency_p50_ms']:.0f} / {others.min():.0f}-{others.max():.0f}",
            "grid_1k_100ms": f"{cell['throughput_vs_baseline_pct']:+.1f} % "
                             f"({cell['vs_baseline_pct_q1']:+.1f} to {cell['vs_baseline_pct_q3']:+.1f})",
            "commit_split": f"{cell['ms_per_commit']:.0f} = {cell['flush_ms_per_commit']:.0f} + "
                            f"{cell['ms_per_commit'] - cell['flush_ms_per_commit']:.0f}",
            "txn_vs_alo": f"{x['throughput_vs_baseline_pct']:+.1f} % "
                          f"({x['vs_baseline_pct_q1']:+.1f} to {x['vs_baseline_pct_q3']:+.1f})"}, problems


def cell_seconds(nb) -> float:
    total = 0.0
    for c in nb.cells:
        m = c.get("metadata", {}).get("execution", {})
        if c.cell_type == "code" and "iopub.execute_input" in m and "TABLES-JSON" not in c.source:
            start = pd.Timestamp(m["iopub.execute_input"])
            total += (pd.Timestamp(m["shell.execute_reply"]) - start).total_seconds()
    return total


def save(nb) -> None:
    """The run's notebook as notebooks/09_cost.ipynb, without the dump cell and the cells'
    timing: the stored tables are then those of a recorded run."""
    nb.cells = [c for c in nb.cells if "TABLES-JSON" not in c.source]
    for c in nb.cells:
        c.metadata.pop("execution", None)
    nbformat.write(nb, NOTEBOOK)


def main(runs: int, keep_last: bool = False) -> int:
    print("| run | load avg (1 min) at start | wall s | cells s | fastest | transactional vs "
          "at_least_once (middle half) | verdicts (amo / idem / txn) | slowest to read "
          "| p50 ms: transactional / others | commit wait falls | grid 1 KB @100 ms vs "
          "at_least_once (middle half) | ms per commit there = flush + commit | agrees |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    failed, every = 0, []
    for i in range(1, runs + 1):
        nb = nbformat.read(NOTEBOOK, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(DUMP))
        load = os.getloadavg()[0]
        t = time.monotonic()
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
        wall = time.monotonic() - t
        out, problems = check_run(nb)
        failed += bool(problems)
        every.append(out)
        v = out["verdicts"]
        print(f"| {i} | {load:.1f} | {wall:.0f} | {cell_seconds(nb):.0f} | "
              f"{out['fastest']} | {out['txn_vs_alo']} | {v['at_most_once']} / {v['idempotent']} / "
              f"{v['transactional']} | {out['slowest_to_read']} | {out['p50']} | "
              f"{'yes' if out['commit_wait_falls'] else 'no'} | {out['grid_1k_100ms']} | "
              f"{out['commit_split']} | "
              f"{'yes' if not problems else 'NO: ' + '; '.join(problems)} |", flush=True)
    print_spread(every)
    if keep_last and not failed:
        save(nb)
        print(f"\nrun {runs}'s outputs stored in {NOTEBOOK.relative_to(ROOT)}")
    return 1 if failed else 0


def print_spread(every: list[dict]) -> None:
    """Each cell's median change against at_least_once, run by run, and how far apart the
    runs were (max - min, in percentage points) for throughput and CPU."""
    print("\nAddPartitionsToTxn refused per commit, run by run:",
          ", ".join(str(out["refused_per_commit"]) for out in every))
    print("\n| published claim | throughput says / CPU says, run by run |\n|---|---|")
    for claim in every[0]["shape"]:
        print(f"| {claim} | " + " ; ".join(out["shape"][claim] for out in every) + " |")
    print("\n| cell | " + " | ".join(f"{k} vs at_least_once %, run by run | spread (points)"
                                     for k in RATIOS) + " |")
    print("|---|" + "---|---|" * len(RATIOS))
    for cell in every[0]["ratios"]:
        if cell.endswith("at_least_once"):
            continue
        parts = []
        for k in RATIOS:
            values = [out["ratios"][cell][k] for out in every]
            values = [v for v in values if v is not None and v == v]
            spread = max(values) - min(values) if values else float("nan")
            mark = "" if spread <= 2 * WITHIN_POINTS else " (over +-5)"
            parts.append(" / ".join(f"{v:+.0f}" for v in values) + f" | {spread:.0f}{mark}")
        print(f"| {cell} | " + " | ".join(parts) + " |")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--save"]
    sys.exit(main(int(args[0]) if args else 5, keep_last="--save" in sys.argv))
