"""Build the lessons as a static site: `make site` (Sphinx with MyST-NB, strict).

The sources are staged in .cache/book/src (the README, the notebooks with their stored
outputs, their solutions and docs/), with an index whose table of contents is the tracks of
notebooks/tracks.toml in their order, the workshop path first. sphinx-build runs with -W:
a broken link between pages, a missing image or a notebook left out of the contents fails
the build. The site is written to _site/ (open _site/index.html)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


START_HERE = ["docs/workshop", "docs/architecture"]  # the docs pages that are not measurements
MANUAL = ["docs/notebooks", "docs/audit", "docs/cli", "docs/torture", "docs/clusters", "docs/room",
          "docs/spark-connect"]  # the manual, moved out of the README


def index(tracks: dict, solutions: list[str], docs: list[str]) -> str:
    """The site's first page: what the lab is, where to start, the tracks as contents."""
    intro = (ROOT / "README.md").read_text().split("\n\n")[1]  # the README's first paragraph
    parts = ["# The delivery-semantics lab", intro,
             "Every lesson below is shown with the outputs of its last run: read it here, then "
             "run it yourself ([setting up](README.md#two-commands): two commands). Teaching a "
             "room: [the 90-minute workshop path](docs/workshop.md).",
             toctree("Start here", ["README", *START_HERE])]
    for track in tracks["track"]:
        parts.append(toctree(f"{track['name']}: {track['about']}",
                             [f"notebooks/{n}" for n in track["notebooks"]]))
    parts.append(toctree("Manual", MANUAL))
    parts.append(toctree("Measurements", [d for d in docs if d not in START_HERE + MANUAL]))
    parts.append(toctree(None, solutions, hidden=True))  # the lessons link them
    return "\n\n".join(parts) + "\n"


def toctree(caption: str | None, entries: list[str], hidden: bool = False) -> str:
    options = [f":caption: {caption}"] if caption else []
    options += [":maxdepth: 1"] + ([":hidden:"] if hidden else [])
    return "```{toctree}\n" + "\n".join(options + [""] + entries) + "\n```"


def stage(src: Path) -> None:
    shutil.rmtree(src, ignore_errors=True)
    (src / "notebooks" / "solutions").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", src)
    shutil.copy(ROOT / "book" / "conf.py", src)
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        if not nb.stem.startswith("_"):  # "_" copies are a test's temporary files
            shutil.copy(nb, src / "notebooks")
    solutions = []
    for page in sorted((NOTEBOOKS / "solutions").glob("*.md")):
        shutil.copy(page, src / "notebooks" / "solutions")
        solutions.append(f"notebooks/solutions/{page.stem}")
    shutil.copytree(ROOT / "docs", src / "docs")
    docs = sorted(f"docs/{p.stem}" for p in (ROOT / "docs").glob("*.md"))
    tracks = tomllib.loads((NOTEBOOKS / "tracks.toml").read_text())
    (src / "index.md").write_text(index(tracks, solutions, docs))


def build(out: Path = ROOT / "_site", work: Path = ROOT / ".cache" / "book") -> Path:
    """Stage the sources in ``work``, build there (MyST-NB writes its picture folder beside
    the build, so the build stays out of the repository's top level), copy the site to
    ``out``."""
    started = time.monotonic()
    src, html = work / "src", work / "html"
    print(f"staging the lessons in {src}", flush=True)
    stage(src)
    print("building the site (sphinx-build, strict) ...", flush=True)
    shutil.rmtree(html, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           "-d", str(work / "doctrees"), str(src), str(html)])
    if done.returncode != 0:
        raise SystemExit(f"the site did not build (the warnings above say where); exit {done.returncode}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(html, out)
    print(f"site built in {time.monotonic() - started:.1f} s: open {out / 'index.html'}")
    return out


if __name__ == "__main__":
    build(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT / "_site")
