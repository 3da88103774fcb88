"""The room served by JupyterHub, measured with browser learners (issue 52; run by hand).

    .venv/bin/python benchmarks/room_hub.py --learners 3 --notebook 01_at_most_once --out /tmp/hub3.json
    .venv/bin/python benchmarks/room_hub.py --learners 3 --notebook CORE     # 00-07, the capstone

Starts ``labkit room serve`` for N learners in a lab home of its own (never the lab's or
another room's; ``labkit down`` on every way out), then N headless Chromium learners at once
(Playwright, as tests/test_room_hub.py drives them): each logs in, waits for its JupyterLab,
opens its copy of each notebook in turn and runs all its cells (Run > Run All Cells),
until no cell is queued or running. Recorded per learner: login to JupyterLab (the spawn),
the notebook's run, its cells' tracebacks. Sampled every second with psutil: CPU
(% of one core) and resident memory of the hub's own processes (hub, proxy, board, culler),
of the learners' servers and kernels with everything they started, and of the room's
Kafka and PostgreSQL; the load average. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from playwright.async_api import async_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labkit.kafka.ports import free_port  # noqa: E402
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.test_room_hub import login  # noqa: E402

HUB_PARTS = ("jupyterhub -f", "configurable-http-proxy", "board_service", "idle_culler")
QUIET_S = 3.0  # no cell queued or running for this long: the run is over
CORE = ["00_tour", "01_at_most_once", "02_at_least_once", "03_idempotent_producer",
        "04_transactions", "05_consume_transform_produce", "06_zombies",
        "07_stateful_exactly_once", "10_capstone"]


def kind(cmd: str) -> str:
    if any(p in cmd for p in HUB_PARTS):
        return "hub"
    if "kafka.Kafka" in cmd or "/postgres " in cmd or cmd.endswith("/postgres"):
        return "kafka+postgres"
    return "learners"


class Sampler(threading.Thread):
    """CPU and RSS of the room's processes (those with its lab home in their environment)."""

    def __init__(self, home: Path):
        super().__init__(daemon=True)
        self.home, self.stop, self.samples = str(home), threading.Event(), []
        self.procs: dict[int, psutil.Process] = {}

    def run(self) -> None:
        while not self.stop.wait(1.0):
            for p in psutil.process_iter(["environ"]):
                if p.pid not in self.procs and (p.info["environ"] or {}).get("LABKIT_HOME") == self.home:
                    self.procs[p.pid] = p
                    p.cpu_percent(None)  # the first call only starts its clock
            row = {"t": time.time(), "load1": os.getloadavg()[0]}
            for pid, p in list(self.procs.items()):
                try:
                    k = kind(" ".join(p.cmdline()))
                    row[f"{k}_cpu"] = row.get(f"{k}_cpu", 0.0) + p.cpu_percent(None)
                    row[f"{k}_rss_mb"] = row.get(f"{k}_rss_mb", 0.0) + p.memory_info().rss / 2 ** 20
                except psutil.Error:
                    self.procs.pop(pid, None)
            self.samples.append(row)


async def run_notebook(page, url: str, name: str, notebook: str) -> tuple[float, int]:
    """All cells of ``notebook`` run in the learner's JupyterLab: seconds and tracebacks."""
    # ?reset: a workspace with this notebook alone (no tab of the one before restored), so
    # Run All Cells and the prompts watched below are this notebook's
    await page.goto(f"{url}/user/{name}/lab/tree/notebooks/{notebook}.ipynb?reset")
    await page.wait_for_function("() => document.querySelectorAll('.jp-Notebook').length === 1",
                                 timeout=60_000)
    await page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle")).first.wait_for(
        timeout=180_000)
    opened = time.monotonic()
    await page.get_by_role("menuitem", name="Run", exact=True).click()
    await page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    busy = ("() => [...document.querySelectorAll('.jp-InputPrompt')]"
            ".some(p => p.textContent.includes('*'))")
    await page.wait_for_function(busy, timeout=60_000)
    quiet_since = None
    while True:  # over once nothing is queued or running for QUIET_S
        if await page.evaluate(busy):
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_S:
            break
        await asyncio.sleep(0.5)
    # a traceback (the notebook's stored outputs have none: any is this run's)
    errors = await page.locator(
        ".jp-RenderedText[data-mime-type='application/vnd.jupyter.error']").count()
    return quiet_since - opened, errors


async def learner(browser, url: str, name: str, password: str, notebooks: list[str]) -> dict:
    """One learner: logs in, then runs the notebooks one after the other, as a learner goes
    through a track (each one's kernel left running, as learners leave them)."""
    context = await browser.new_context(viewport={"width": 1200, "height": 900})
    page = await context.new_page()
    began = time.monotonic()
    try:
        await login(page, url, name, password)
        await page.wait_for_url(re.compile(f".*/user/{name}/lab.*"), timeout=180_000)
        spawned = time.monotonic()
        runs, errors = {}, {}
        for notebook in notebooks:
            seconds, errors[notebook] = await run_notebook(page, url, name, notebook)
            runs[notebook] = round(seconds, 1)
        return {"learner": name, "spawn_s": round(spawned - began, 1), "runs": runs,
                "errors": errors}
    except Exception as exc:  # recorded, not raised: one learner's failure is a finding
        await page.screenshot(path=str(Path(tempfile.gettempdir()) / f"room-hub-{name}.png"))
        return {"learner": name, "failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
    finally:
        await context.close()


async def learners(url: str, passwords: dict[str, str], notebooks: list[str]) -> list[dict]:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                           headless=True)
        try:
            return list(await asyncio.gather(*(learner(browser, url, n, p, notebooks)
                                               for n, p in passwords.items())))
        finally:
            await browser.close()


def summary(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 1), "p95": round(p95, 1),
            "max": round(ordered[-1], 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--learners", type=int, default=3)
    parser.add_argument("--notebook", default="01_at_most_once",
                        help="one notebook, or several comma-separated, run in that order "
                             "(the Core track and the capstone: CORE)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="room-hub-bench-")) / "lab"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_")}
    env["LABKIT_HOME"] = str(home)
    for k in ("LABKIT_CACHE", "LABKIT_JAVA", "LABKIT_MVN"):  # where the jars are: kept
        if k in os.environ:
            env[k] = os.environ[k]
    port = free_port()
    cli = [sys.executable, "-m", "labkit.cli"]
    sampler = Sampler(home)
    try:
        began = time.monotonic()
        served = subprocess.run([*cli, "room", "serve", "--learners", str(args.learners),
                                 "--port", str(port)], env=env, cwd=ROOT, capture_output=True,
                                text=True, timeout=300)
        if served.returncode != 0:
            print(served.stdout + served.stderr, file=sys.stderr)
            return 1
        serve_s = time.monotonic() - began
        passwords = dict(re.findall(r"^(learner\d\d) +(\S+)$", served.stdout, re.M))
        sampler.start()
        time.sleep(3)  # the hub alone, before anyone logs in
        idle = list(sampler.samples)
        began = time.monotonic()
        notebooks = CORE if args.notebook == "CORE" else args.notebook.split(",")
        results = asyncio.run(learners(f"http://127.0.0.1:{port}", passwords, notebooks))
        wall = time.monotonic() - began
    finally:
        sampler.stop.set()
        subprocess.run([*cli, "down"], env=env, cwd=ROOT, capture_output=True, timeout=180)
        shutil.rmtree(home.parent, ignore_errors=True)  # its learners' homes: nothing to keep
    busy = [s for s in sampler.samples if s not in idle]
    record = {
        "learners": args.learners, "notebook": args.notebook, "cores": psutil.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2 ** 30, 1),
        "serve_s": round(serve_s, 1), "wall_s": round(wall, 1), "results": results,
        "spawn_s": summary([r["spawn_s"] for r in results if "spawn_s" in r]),
        "run_s": {nb: summary([r["runs"][nb] for r in results if nb in r.get("runs", {})])
                  for nb in notebooks},
        "hub_idle": {k: round(statistics.mean(s.get(k, 0) for s in idle), 1)
                     for k in ("hub_cpu", "hub_rss_mb")} if idle else {},
        "peak": {k: round(max((s.get(k, 0) for s in busy), default=0), 1)
                 for k in ("hub_cpu", "hub_rss_mb", "learners_cpu", "learners_rss_mb",
                           "kafka+postgres_cpu", "kafka+postgres_rss_mb", "load1")},
        "mean": {k: round(statistics.mean(s.get(k, 0) for s in busy), 1) if busy else 0
                 for k in ("hub_cpu", "learners_cpu", "kafka+postgres_cpu")},
    }
    print(json.dumps({k: v for k, v in record.items() if k != "results"}, indent=1))
    for r in results:
        print(r)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))
    return 0 if all("failed" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
