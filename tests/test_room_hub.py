"""The room served by JupyterHub, in real browsers: `labkit room serve` (what `make room`
runs) in a lab home of the test's own, three learners logged in at once in Chromium (Debian's,
driven by Playwright: scripts/install-test-deps.sh), each running a cell in its own
JupyterLab against the room's secure Kafka and its own PostgreSQL schema, then its copy of
notebook 01 end to end (Run All Cells: its audit's count of lost payments in the page) and
of the capstone as shipped, to its check's verdict ("Not yet", with a hint); the hub
refusing one learner another's server and the board; the instructor (the hub's admin)
seeing the three on the board; the limits on the learners' processes; a learner's second
login and its killed server (test_second_login_and_killed_server, on the same room); then
`labkit down` (what `make down` runs) leaving none of the room's processes running.

Needs the room's proxy: `make room` or `make test` installs it (npm ci in scripts/room).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from playwright.async_api import TimeoutError as PlaywrightTimeout
from playwright.async_api import async_playwright

from labkit.kafka.ports import free_port
from labkit.room.hub import PROXY_DIR
from tests.test_browser import CHROMIUM_ARGS, CHROMIUM, chromium_or_fail

ROOT = Path(__file__).resolve().parents[1]
LEARNERS = ("learner01", "learner02", "learner03")
# A learner's first cell: its namespace, one record written and read on the room's SASL_SSL
# cluster, and every topic the broker lets it see (its ACLs: its own only).
CHECK_CELL = """\
from confluent_kafka.admin import AdminClient
from labkit.kafka import cluster, names
from labkit.kafka.clientlog import client_config
from labkit.kafka import topics
from labkit.pipelines import data

lab = cluster.ensure()
data.load_into_topic(lab.bootstrap, "hello", data.generate(1))
got = topics.read(lab.bootstrap, "hello")
seen = AdminClient(client_config({"bootstrap.servers": lab.bootstrap})).list_topics(timeout=20)
visible = sorted(t for t in seen.topics if not t.startswith("__"))
from labkit.room import board
from labkit.storage import postgres
from labkit.storage.db import Database

board.publish_verdict("01_at_most_once", "hub-check", True, "ran in the room's hub")
with Database(postgres.ensure()) as db:  # LABKIT_PG_DSN: its own role and schema
    db.execute("CREATE TABLE IF NOT EXISTS mine (who text)")
    db.execute("INSERT INTO mine VALUES (?)", (names.namespace(),))
    pg = "/".join(db.query("SELECT current_user, current_schema()")[0])
open("work.txt", "w").write(f"{names.namespace()}'s work")  # what a reload must not lose
print(f"namespace={names.namespace()} records={len(got)} visible={visible} pg={pg}")
"""


def _notebook(source: str) -> str:
    return json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": "check", "metadata": {},
                   "outputs": [], "source": source}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5})


def _labkit(env: dict, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def room_processes(home: Path) -> dict[int, str]:
    """Every process with this room's lab home in its environment: the hub, its proxy, the
    learners' servers and kernels, the brokers and PostgreSQL all inherit it."""
    found = {}
    for p in psutil.process_iter(["cmdline", "environ"]):
        if p.pid != os.getpid() and (p.info["environ"] or {}).get("LABKIT_HOME") == str(home):
            found[p.pid] = " ".join(p.info["cmdline"] or ())
    return found


def _short(found: dict[int, str]) -> str:
    return "; ".join(f"{pid}: {cmd[:150]}" for pid, cmd in found.items())


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    """`labkit room serve` for three learners in a lab home of its own (not the suite's, nor
    a `labkit up` lab's: `labkit down` here stops only what this home holds); `labkit down`
    on every way out."""
    tmp_path = tmp_path_factory.mktemp("room")
    chromium_or_fail()
    if not (ROOT / PROXY_DIR / "node_modules" / ".bin" / "configurable-http-proxy").exists():
        pytest.fail(f"the room's proxy is missing: run `make room` (npm ci --prefix {PROXY_DIR})")
    home = tmp_path / "lab"
    env = {k: v for k, v in os.environ.items() if k not in (
        "LABKIT_BOOTSTRAP", "LABKIT_KAFKA_CONFIG", "LABKIT_NAMESPACE", "LABKIT_PG_DSN",
        "LABKIT_ROOM")}
    env["LABKIT_HOME"] = str(home)
    homes = home / "room" / "homes"
    for name in LEARNERS:  # a notebook of its own in each home, before its first login
        (homes / name).mkdir(parents=True)
        (homes / name / "check.ipynb").write_text(_notebook(CHECK_CELL))
    port = free_port()
    try:
        served = _labkit(env, "room", "serve", "--learners", str(len(LEARNERS)),
                         "--port", str(port), timeout=240)
        assert served.returncode == 0, served.stdout + served.stderr
        passwords = dict(re.findall(r"^(learner\d\d) +(\S+)$", served.stdout, re.M))
        assert sorted(passwords) == list(LEARNERS), served.stdout
        admin = re.search(r"log in as (\w+): (\S+);", served.stdout)
        assert admin, served.stdout
        yield {"url": f"http://127.0.0.1:{port}", "passwords": passwords, "home": home,
               "homes": homes, "env": env, "admin": (admin[1], admin[2])}
    finally:
        _labkit(env, "down", timeout=120)


async def login(page, url: str, name: str, password: str) -> None:
    await page.goto(f"{url}/hub/login")
    await page.get_by_label("Username:").fill(name)
    await page.get_by_label("Password:").fill(password)
    await page.get_by_role("button", name="Sign in").click()


async def _learner(browser, url: str, name: str, password: str, other: str) -> dict:
    """One learner: logs in, runs its notebook's cell, tries another learner's server and
    the instructor's board."""
    context = await browser.new_context(viewport={"width": 1200, "height": 900})
    page = await context.new_page()
    try:
        await login(page, url, name, password)
        # the hub spawns its server, then sends it to its JupyterLab
        await page.wait_for_url(re.compile(f".*/user/{name}/lab.*"), timeout=90_000)
        await page.goto(f"{url}/user/{name}/lab/tree/check.ipynb")
        cell = page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor").first
        await cell.wait_for(timeout=60_000)
        await _run_first_cell(page, cell)
        output = page.locator(".jp-OutputArea-output", has_text="namespace=")
        await output.wait_for(timeout=90_000)
        text = await output.inner_text()
        # the hub refuses this learner another's server (its files, its kernels)
        theirs = await page.goto(f"{url}/user/{other}/api/contents/check.ipynb")
        body = await page.content()
        # the board is the hub admin's: the hub's OAuth refuses a learner
        board = await page.goto(f"{url}/services/board/")
        board_body = await page.content()
        # its copies of the lessons (the hub's, in its home): notebook 01 end to end, then
        # the capstone with the team's loop as shipped, to its check's verdict
        lesson = await _run_all(page, url, name, "01_at_most_once")
        capstone = await _run_all(page, url, name, "10_capstone")
        return {"output": text, "other_status": theirs.status,
                "other_leaked": "load_into_topic" in body, "board_status": board.status,
                "board_leaked": "data-learner" in board_body or "<h1>Room" in board_body,
                "lesson": lesson, "capstone": capstone}
    except Exception:
        await page.screenshot(path=str(Path(tempfile.gettempdir()) / f"labkit-room-{name}.png"))
        raise
    finally:
        await context.close()


async def _run_first_cell(page, cell, attempts: int = 3) -> None:
    """Ctrl+Enter on the notebook's cell once its kernel is connected. A cell run before the
    session has its kernel is not queued (JupyterLab asks "Select Kernel" instead), so:
    wait for the status bar's "Idle", answer that dialog if it comes, and try again while
    the cell's prompt still says it never ran ("[ ]:"; never a second run of a started one)."""
    await page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle")).first.wait_for(
        timeout=90_000)
    never_ran = "() => /\\[ \\]/.test(document.querySelector('.jp-Cell .jp-InputPrompt').textContent)"
    for _ in range(attempts):
        await cell.click()
        await page.keyboard.press("Control+Enter")
        select = page.locator(".jp-Dialog").get_by_role("button", name="Select")
        try:
            await page.wait_for_function(f"() => !({never_ran})()", timeout=15_000)
            return
        except PlaywrightTimeout:
            if await select.count():
                await select.click()
    raise AssertionError("the notebook's cell never started running")


# Every code cell of the open notebook: its source, its prompt ("[ ]:", "[*]:", "[3]:") and
# its outputs' text. (An error's output is not told apart in the page: JupyterLab renders a
# traceback as stderr, data-mime-type application/vnd.jupyter.stderr, like any stderr.)
CELLS_JS = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].map(c => ({
    code: c.querySelector('.jp-InputArea-editor')?.textContent ?? '',
    prompt: c.querySelector('.jp-InputPrompt')?.textContent ?? '',
    output: [...c.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent).join('\\n')}))"""
# Run All Cells is over: it marks every cell queued ("*") at once, so the run is over when no
# cell is queued or running and one has run (a number in its prompt). A cell that raises
# ends it: the kernel drops the rest, whose prompts go back to empty.
RAN_JS = f"""() => {{
    const cells = ({CELLS_JS})();
    return !cells.some(c => c.prompt.includes('*')) && cells.some(c => /\\d/.test(c.prompt));
}}"""


async def _run_all(page, url: str, name: str, notebook: str) -> list[dict]:
    """The learner opens its copy of ``notebook`` (notebooks/, copied into its home by the
    hub), clears its stored outputs (Edit > Clear Outputs of All Cells: whatever is seen
    after is this run's), runs it (Run > Run All Cells) and waits until every cell ran or
    one raised. Its code cells, as CELLS_JS reads them."""
    # ?reset: a workspace with this notebook alone, so the menus act on it
    await page.goto(f"{url}/user/{name}/lab/tree/notebooks/{notebook}.ipynb?reset")
    await page.wait_for_function("() => document.querySelectorAll('.jp-Notebook').length === 1",
                                 timeout=90_000)
    # its kernel connected (Run All before that asks "Select Kernel" and runs nothing)
    await page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle")).first.wait_for(
        timeout=180_000)
    await page.get_by_role("menuitem", name="Edit", exact=True).click()
    await page.get_by_role("menuitem", name="Clear Outputs of All Cells", exact=True).click()
    await page.wait_for_function(
        f"() => ({CELLS_JS})().every(c => !c.output && !/\\d/.test(c.prompt))", timeout=30_000)
    await page.get_by_role("menuitem", name="Run", exact=True).click()
    await page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    await page.wait_for_function(RAN_JS, timeout=480_000, polling=1000)
    return await page.evaluate(CELLS_JS)


def _output_of(cells: list[dict], code: str) -> str:
    """The output of the code cell whose source holds ``code``."""
    found = [c["output"] for c in cells if code in c["code"]]
    assert len(found) == 1, (code, [c["code"][:80] for c in cells])
    return found[0]


def _tracebacks(cells: list[dict]) -> list[str]:
    """The cell that ended Run All Cells early, with its output: the last one that ran, when
    code cells after it never ran (JupyterLab runs none after one that raises)."""
    ran = [i for i, c in enumerate(cells) if re.search(r"\d", c["prompt"])]
    if not ran or ran[-1] == len(cells) - 1:
        return []
    stopped = cells[ran[-1]]
    return [f"{stopped['code'][:80]}: {stopped['output'][-1500:]}"]


async def _wrong_password(browser, url: str, name: str) -> str:
    context = await browser.new_context()
    page = await context.new_page()
    try:
        await page.goto(f"{url}/hub/login")
        await page.get_by_label("Username:").fill(name)
        await page.get_by_label("Password:").fill("not-the-password")
        await page.get_by_role("button", name="Sign in").click()
        error = page.locator("p.login_error")
        await error.wait_for(timeout=30_000)
        return await error.inner_text()
    finally:
        await context.close()


async def _instructor(browser, url: str, name: str, password: str) -> list[str]:
    """The hub's admin logs in, lands on the board, and sees every learner's row."""
    context = await browser.new_context()
    page = await context.new_page()
    try:
        await login(page, url, name, password)
        await page.wait_for_url(re.compile(".*/services/board/.*"), timeout=60_000)
        rows = page.locator("tr[data-learner]")
        await page.wait_for_function(
            f"() => document.querySelectorAll('tr[data-learner]').length >= {len(LEARNERS)}",
            timeout=60_000)
        return [await r.get_attribute("data-learner") for r in await rows.all()]
    except Exception:
        await page.screenshot(path=str(Path(tempfile.gettempdir()) / "labkit-room-board.png"))
        raise
    finally:
        await context.close()


async def _three_learners(url: str, passwords: dict[str, str],
                          admin: tuple[str, str]) -> tuple[list[dict], str, list[str]]:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                           headless=True)
        try:
            others = LEARNERS[1:] + LEARNERS[:1]
            results = await asyncio.gather(*(
                _learner(browser, url, name, passwords[name], other)
                for name, other in zip(LEARNERS, others)))
            refused = await _wrong_password(browser, url, LEARNERS[0])
            board = await _instructor(browser, url, *admin)
        finally:
            await browser.close()
    return list(results), refused, board


def learner_servers(home: Path) -> dict[str, psutil.Process]:
    """Each learner's running JupyterLab server (its USER is the learner's name)."""
    found = {}
    for pid, cmd in room_processes(home).items():
        if "jupyterhub.singleuser" in cmd:
            p = psutil.Process(pid)
            found[p.environ()["USER"]] = p
    return found


def _pg_refusal(dsn: str, other: str) -> str:
    """What the server answers one learner's role reading another's schema (after making a
    lesson's per-run schema as that role, as the database lessons do)."""
    import psycopg

    from labkit.storage import postgres

    run = postgres.fresh_schema("learner01_a_run", dsn)
    with psycopg.connect(run, autocommit=True, connect_timeout=20) as conn:
        conn.execute("CREATE TABLE payments (id int)")
    with psycopg.connect(dsn, autocommit=True, connect_timeout=20) as conn:
        own = conn.execute("SELECT who FROM mine").fetchall()
        try:
            conn.execute(f"SELECT who FROM {other}.mine").fetchall()
            return f"read it (own rows {own})"
        except psycopg.errors.InsufficientPrivilege as exc:
            return f"own rows {own}; refused: {exc}"


def test_three_learners_in_browsers(room) -> None:
    started = time.monotonic()
    results, refused, board = asyncio.run(
        _three_learners(room["url"], room["passwords"], room["admin"]))
    for name, result in zip(LEARNERS, results):
        # its namespace, its record read back, the broker showing it its own topic only (and
        # the board's, which its ACLs let it write, not read), and its PostgreSQL role in
        # its own schema
        assert (f"namespace={name} records=1 visible=['labkit-room-room', '{name}.hello'] "
                f"pg={name}/{name}" in result["output"]), result
        assert result["other_status"] in (403, 404), result
        assert not result["other_leaked"], result
        assert result["board_status"] == 403 and not result["board_leaked"], result
        # its home got the lab's notebooks (copied once, at its first start)
        assert (room["homes"] / name / "notebooks" / "01_at_most_once.ipynb").is_file()
        # notebook 01 ran to its end in its JupyterLab, no traceback; its at-most-once
        # audit (section 2: commit first, crash on the 2nd batch) counted the batch lost
        lesson, capstone = result["lesson"], result["capstone"]
        # (every cell ran, since none raised: _run_all waited for all or a traceback)
        assert not _tracebacks(lesson), (name, _tracebacks(lesson))
        audit = _output_of(lesson, "crash.report.summary()")
        assert "produced=40 delivered_unique=30 lost=10 duplicated=0" in audit, (name, audit)
        assert "first lost ids: ['r-000011'" in audit, (name, audit)
        # the capstone with the team's loop: its check's verdict, "Not yet" with the hint
        # that the ledger and the input offsets must commit together
        assert not _tracebacks(capstone), (name, _tracebacks(capstone))
        verdict = _output_of(capstone, "capstone.check_capstone(")
        assert re.search(r"🔁 Not yet: \d of 5 experiments are not exactly-once\. ", verdict), \
            (name, verdict)
        assert "crash as its commit is sent: charged twice" in verdict, (name, verdict)
        assert ("Hints: a crash between writing the ledger and committing the input offsets "
                "repeats the batch: the two must commit together, atomically") in verdict, \
            (name, verdict)
    assert "Invalid username or password" in refused
    assert sorted(board) == list(LEARNERS), board  # each one's verdict, on the admin's board
    print(f"\nthree learners, notebooks 01 and 10 and the board in "
          f"{time.monotonic() - started:.1f} s; {LEARNERS[-1]}'s verdict: {verdict}")

    servers = learner_servers(room["home"])
    assert sorted(servers) == list(LEARNERS), servers
    for name, server in servers.items():
        # the memory limit, set at spawn, in the server and its kernel alike
        for p in (server, *server.children(recursive=True)):
            assert p.rlimit(psutil.RLIMIT_DATA) == (4 * 1024 ** 3,) * 2, (name, p.cmdline())
    # the PostgreSQL server itself refuses learner01's role learner02's schema
    dsn = servers["learner01"].environ()["LABKIT_PG_DSN"]
    answer = _pg_refusal(dsn, "learner02")
    assert "refused: permission denied for schema learner02" in answer, answer
    assert "[('learner01',)]" in answer, answer


async def _second_login_and_killed_server(url: str, name: str, password: str,
                                          home: Path) -> dict:
    """learner01 in two browsers at once, then its server SIGKILLed under the first one."""
    lab = re.compile(f".*/user/{name}/lab.*")
    work = f"{url}/user/{name}/api/contents/work.txt"
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                           headless=True)
        try:
            first, second = await browser.new_context(), await browser.new_context()
            a, b = await first.new_page(), await second.new_page()
            await login(a, url, name, password)
            await a.wait_for_url(lab, timeout=60_000)
            await b.goto(f"{url}/hub/login")
            notice = await b.locator(".announcement").inner_text()
            await login(b, url, name, password)
            await b.wait_for_url(lab, timeout=60_000)  # the same server, not a second one
            both = [await (await page.goto(work)).json() for page in (a, b)]
            server = learner_servers(home)[name]
            server.kill()
            server.wait(10)
            messages = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the learner reloads until it can start it
                await a.goto(f"{url}/user/{name}/lab")
                text = await a.locator("body").inner_text()
                messages.append(" ".join(text.split())[:300])
                if await a.locator("#labkit-kept").count():
                    break
                await asyncio.sleep(2)
            await a.locator("#start").click()
            await a.wait_for_url(lab, timeout=90_000)
            after = await (await a.goto(work)).json()
        finally:
            await browser.close()
    return {"notice": notice, "both": [m["content"] for m in both], "messages": messages,
            "after": after["content"], "restarted": server.pid not in learner_servers(home)}


def test_second_login_and_killed_server(room) -> None:
    """A learner's second login gets the same JupyterLab (said on the login page); a killed
    server gets the hub's page saying its files are kept and a Start button; its saved work
    is there after both."""
    name = LEARNERS[0]
    started = time.monotonic()
    got = asyncio.run(_second_login_and_killed_server(room["url"], name,
                                                      room["passwords"][name], room["home"]))
    assert "opens the same JupyterLab" in got["notice"], got
    assert got["both"] == [f"{name}'s work"] * 2, got
    assert "Your saved files are kept" in got["messages"][-1], got
    assert any("is not running" in m for m in got["messages"]), got
    assert got["after"] == f"{name}'s work", got
    print(f"\nsecond login and killed server in {time.monotonic() - started:.1f} s: "
          f"{got['messages']}")


def test_down_leaves_nothing(room) -> None:
    running = room_processes(room["home"])
    commands = " ".join(running.values())
    for part in ("jupyterhub -f", "configurable-http-proxy", "jupyterhub.singleuser",
                 "ipykernel_launcher", "kafka.Kafka", "postgres", "labkit.room.board_service",
                 "jupyterhub_idle_culler"):
        assert part in commands, f"no {part} among the room's processes: {_short(running)}"
    down = _labkit(room["env"], "down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped the room's JupyterHub" in down.stdout, down.stdout
    deadline = time.monotonic() + 10
    while (left := room_processes(room["home"])) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"`labkit down` left the room's processes running: {_short(left)}"
    # the learners' work stays for the next start of the room
    assert (room["homes"] / LEARNERS[0] / "check.ipynb").is_file()


def test_bad_limits_get_a_clear_message(tmp_path: Path) -> None:
    """`labkit room serve` refuses limits it cannot apply before it starts anything."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_")}
    env["LABKIT_HOME"] = str(tmp_path / "lab")
    memory = _labkit(env, "room", "serve", "--mem-limit", "4X", timeout=60)
    assert memory.returncode != 0 and "give bytes with K, M or G" in memory.stderr, memory
    idle = _labkit(env, "room", "serve", "--cull-idle", "10", timeout=60)
    assert idle.returncode != 0 and "--cull-idle must be 60 s or more" in idle.stderr, idle
    assert not room_processes(tmp_path / "lab")  # nothing was started
