"""The live dashboard in a real browser: JupyterLab (headless, 127.0.0.1, no token) runs
tests/browser/dashboard_demo.ipynb against the test broker while Chromium (Debian's, driven
by Playwright; install it with scripts/install-test-deps.sh) watches the page.

Takes a mid-experiment screenshot (LABKIT_UPDATE_SCREENSHOT=1 writes it to docs/dashboard.png,
the README's picture) and prints the
dashboard's measured refresh rate and CPU cost (docs/measurements-widgets.md):
    LABKIT_MEASURE=1 .venv/bin/pytest tests/test_browser.py -s
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from labkit.kafka.ports import free_port

HERE = Path(__file__).parent
NOTEBOOK = HERE / "browser" / "dashboard_demo.ipynb"
# The README's picture is refreshed only on request (LABKIT_UPDATE_SCREENSHOT=1), so that a
# test run does not modify a tracked file; otherwise the shot goes to the temp dir.
README_SCREENSHOT = HERE.parent / "docs" / "dashboard.png"
SCREENSHOT = (README_SCREENSHOT if os.environ.get("LABKIT_UPDATE_SCREENSHOT")
              else Path(tempfile.gettempdir()) / "labkit-dashboard.png")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_or_fail() -> None:
    """The browser tests need Debian's Chromium; without it they fail saying how to get it."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-test-deps.sh (apt-get install chromium)")


def wait_for_http(url: str, server: subprocess.Popen, timeout_s: float,
                  why: Callable[[], str], interval_s: float = 0.3) -> None:
    """Until ``url`` answers; fails with ``why()`` if ``server`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(why()) from None
            time.sleep(interval_s)


@pytest.fixture
def jupyterlab(tmp_path: Path, bootstrap: str):
    """A JupyterLab of our own on 127.0.0.1 serving a temp dir with the demo notebook."""
    chromium_or_fail()
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)  # no "would you like news?" toast over the screenshot
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port = free_port()
    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap,
           "LABKIT_DASHBOARD_STATS": str(tmp_path / "stats.json"),
           "LABKIT_DEMO_PAUSE_S": "0.25",
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    env.pop("LABKIT_WIDGETS", None)  # the live/static guess itself is under test
    log = (tmp_path / "jupyterlab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--IdentityProvider.token=", f"--ServerApp.root_dir={root}",
         f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
         f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
         "--LabApp.expose_app_in_browser=True",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/api/status", server, 90,
                      lambda: f"JupyterLab did not start; see {tmp_path / 'jupyterlab.log'}")
        yield url, tmp_path
    finally:
        server.send_signal(signal.SIGTERM)  # Jupyter shuts its kernels down on SIGTERM
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()


def counter(page, name: str) -> int:
    return int(page.locator(f'[data-counter="{name}"]').get_attribute("data-value"))


def take_screenshot_mid_transaction(page, attempts: int = 4) -> bool:
    """The README picture, caught while a transaction is open (amber cells, LSO < HW).
    The page refreshes while Chromium paints, so retry until the same transaction was open
    before and after the shot (no new COMMIT/ABORT marker in between)."""
    def open_and_markers() -> tuple[int, int]:
        return (page.locator('.lk-cell[data-state="open"]').count(),
                page.locator('.lk-cell[data-state="commit"], .lk-cell[data-state="abort"]').count())

    page.locator(".lk-dashboard").screenshot(path=str(SCREENSHOT))  # a picture in any case
    for _ in range(attempts):
        page.wait_for_selector('.lk-cell[data-state="open"]', timeout=60_000)
        before = open_and_markers()
        shot = page.locator(".lk-dashboard").screenshot()
        after = open_and_markers()
        if before[0] and after[0] and before[1] == after[1]:
            SCREENSHOT.write_bytes(shot)
            return True
        page.wait_for_function("() => !document.querySelector('.lk-cell[data-state=open]')",
                               timeout=60_000)
    return False


def test_dashboard_updates_live_in_jupyterlab(jupyterlab) -> None:
    from playwright.sync_api import sync_playwright

    url, tmp_path = jupyterlab
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1000, "height": 1300}, device_scale_factor=2)
        page = context.pages[0] if context.pages else context.new_page()
        try:
            page.goto(f"{url}/lab/tree/{NOTEBOOK.name}")
            page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook')",
                                   timeout=90_000)
            # Kernel ready, then run every cell (not awaited: it resolves only at the end).
            page.wait_for_function(
                "() => window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel"
                "?.status === 'idle'", timeout=90_000)
            page.evaluate("() => { const c = window.jupyterapp.commands;"
                          " c.execute('application:toggle-left-area');"
                          " c.execute('notebook:run-all-cells'); }")

            # The live widget appears and follows the experiment.
            page.wait_for_selector(".lk-dashboard", timeout=120_000)
            first = counter(page, "produced")
            page.wait_for_function(
                "n => Number(document.querySelector('[data-counter=produced]').dataset.value) > n",
                arg=first, timeout=60_000)
            page.wait_for_selector('.lk-cell[data-state="commit"]', timeout=60_000)
            page.wait_for_selector('.lk-cell[data-state="abort"]', timeout=60_000)
            page.wait_for_selector('.lk-cell[data-state="duplicate"]', timeout=60_000)
            assert counter(page, "delivered") > 0
            assert page.locator('[data-mark="hw"]').count() == 1
            SCREENSHOT.parent.mkdir(exist_ok=True)
            if not take_screenshot_mid_transaction(page):
                print(f"note: {SCREENSHOT} shows no open transaction this time")
            assert SCREENSHOT.stat().st_size > 10_000  # a real picture of the dashboard

            # When the experiment ends the live widget becomes the static picture.
            page.wait_for_selector(".lk-dashboard", state="detached", timeout=120_000)
            page.wait_for_selector('.jp-OutputArea-output img[src^="data:image/png"]', timeout=30_000)
            stats_file = tmp_path / "stats.json"
            deadline = time.monotonic() + 60
            while not stats_file.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            page.wait_for_selector("text={'produced'", timeout=30_000)  # the audit printed
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))
            raise
        finally:
            context.close()
    stats = json.loads(stats_file.read_text())
    print("\ndashboard measurement:", json.dumps(stats))
    assert stats["loop"]["refreshes"] >= 2 and stats["loop"]["errors"] == 0, stats["loop"]
    assert SCREENSHOT.stat().st_size > 10_000
