"""The lessons' site (`make site`, book/build.py): built strictly, then read in Chromium.

Strict: sphinx-build -W, so a broken link between pages or a missing image fails the build
(shown on a page made to have one). In the browser (Debian's Chromium, driven by Playwright
as in test_browser.py): the first page lists every track's notebooks in the order of
notebooks/tracks.toml, every lesson page loads with its title, shows rendered outputs and
pictures, fetches nothing from the network and logs no error, and a lesson's link to the
audit's glossary (docs/audit.md) lands on that section.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.notebook_cells import NOTEBOOKS, read
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, chromium_or_fail

ROOT = Path(__file__).parents[1]
TRACKS = tomllib.loads((NOTEBOOKS / "tracks.toml").read_text())
LESSONS = [n for t in TRACKS["track"] for n in t["notebooks"]]


def book():
    spec = importlib.util.spec_from_file_location("book_build", ROOT / "book" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("site")
    return book().build(out=tmp / "site", work=tmp / "work")


def title_of(name: str) -> str:
    return read(name).cells[0].source.splitlines()[0].lstrip("# ").strip()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text((ROOT / "book" / "conf.py").read_text())
    (src / "index.md").write_text("# Lab\n\n```{toctree}\npage\n```\n")
    (src / "page.md").write_text("# Page\n\nSee [the audit](README.md#reading-the-audit).\n\n"
                                 "![a picture](missing.png)\n")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           str(src), str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode != 0
    assert "README.md" in done.stderr and "missing.png" in done.stderr, done.stderr


def test_the_first_page_lists_the_tracks_in_order(site):
    index = (site / "index.html").read_text()
    positions = [index.find(f'href="notebooks/{name}.html"') for name in LESSONS]
    assert -1 not in positions, [n for n, p in zip(LESSONS, positions) if p == -1]
    assert positions == sorted(positions)
    assert 'href="docs/workshop.html"' in index


def test_every_lesson_page_loads_with_its_outputs_and_no_error_in_chromium(site):
    chromium_or_fail()
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            current = {"name": ""}
            page.on("console", lambda m: problems.append(f"{current['name']}: console {m.text}")
                    if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"{current['name']}: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"{current['name']}: failed {r.url}"))
            for name in LESSONS:
                current["name"] = name
                page.goto((site / "notebooks" / f"{name}.html").as_uri())
                page.wait_for_load_state("load")
                shown = page.locator("h1").first.inner_text().strip().rstrip("#").strip()
                assert shown.replace("’", "'") == title_of(name)  # typographic apostrophes
                outputs = page.locator(".cell_output").count()
                pictures = page.eval_on_selector_all(
                    ".cell_output img", "imgs => imgs.map(i => i.complete && i.naturalWidth > 0)")
                if outputs == 0 or not all(pictures):
                    problems.append(f"{name}: {outputs} outputs, pictures loaded {pictures}")
            # a lesson's glossary link lands on the audit page's section
            current["name"] = "00_tour -> docs/audit"
            page.goto((site / "notebooks" / "00_tour.html").as_uri())
            page.locator('a[href$="#reading-the-audit"]').first.click()
            page.wait_for_load_state("load")
            assert page.url.endswith("docs/audit.html#reading-the-audit")
            assert page.locator("#reading-the-audit h1").inner_text().startswith("Reading the audit")
        finally:
            browser.close()
    assert problems == []
