"""The curriculum's route holds together: every notebook is in one track of
notebooks/tracks.toml, says so in its header (track, what to read before, time, next), ends
with a Next link to the notebook after it, and every reference to a notebook (a link or
"notebook 05" in prose) in the notebooks, README.md and docs/ names one that exists.
Static: reads files only."""
from __future__ import annotations

import re
import tomllib

import pytest

from tests.notebook_cells import NAMES, NOTEBOOKS, read

ROOT = NOTEBOOKS.parent
TRACKS = tomllib.loads((NOTEBOOKS / "tracks.toml").read_text())
ORDER = [n for track in TRACKS["track"] for n in track["notebooks"]]
LINK = re.compile(r"\]\(((?:\.\./notebooks/|notebooks/)?)([\w-]+)\.ipynb(#[\w-]*)?\)")
HEADER = re.compile(r"^> \*\*Track:\*\* (?P<track>[^(]+) \((?P<pos>\d+) of (?P<total>\d+)\)"
                    r" · \*\*Before this:\*\* (?P<before>.+?) · \*\*Time:\*\* ~(?P<minutes>\d+) min"
                    r"(?: · \*\*Next:\*\* (?P<next>.+))?$", re.M)
RANGE = re.compile(r"\]\(([\w-]+)\.ipynb\)\s*[-–]\s*\[[^\]]*\]\(([\w-]+)\.ipynb\)")
# "notebook 05", "notebooks 08a and 08b", "notebook 02's": a number that must name a notebook
PROSE_REF = re.compile(r"\bnotebooks? (\d\d[a-z]?)\b(?:(?:,| and| or|–|-) ?(\d\d[a-z]?)\b)?")


def targets(text: str) -> list[str]:
    return [m.group(2) for m in LINK.finditer(text)]


def markdown(name: str) -> list[str]:
    return [c.source for c in read(name).cells if c.cell_type == "markdown"]


def test_every_notebook_is_in_exactly_one_track_and_every_name_exists():
    assert sorted(ORDER) == sorted(set(ORDER)), "a notebook is listed twice in tracks.toml"
    assert sorted(ORDER) == NAMES, (f"not in a track: {sorted(set(NAMES) - set(ORDER))}; "
                                    f"no such notebook: {sorted(set(ORDER) - set(NAMES))}")
    assert set(TRACKS["before"]) == set(ORDER) - {ORDER[0]}, "each notebook but the first names what comes before it"
    assert all(b in NAMES for before in TRACKS["before"].values() for b in before)


@pytest.mark.parametrize("name", ORDER)
def test_the_header_states_track_before_time_and_next(name):
    first = markdown(name)[0]
    found = HEADER.search(first)
    assert found, f"{name}: no header line '> **Track:** ... · **Before this:** ... · **Time:** ~N min'"
    track = next(t for t in TRACKS["track"] if name in t["notebooks"])
    assert found["track"].strip() == track["name"]
    assert (int(found["pos"]), int(found["total"])) == (track["notebooks"].index(name) + 1,
                                                         len(track["notebooks"]))
    before = TRACKS["before"].get(name, [])
    assert targets(found["before"]) == before or (not before and found["before"] == "none")
    assert 5 <= int(found["minutes"]) <= 30, f"{name}: a notebook is read and run in 5-30 min"
    following = ORDER[ORDER.index(name) + 1] if name != ORDER[-1] else None
    assert (targets(found["next"]) if found["next"] else [None]) == [following]


@pytest.mark.parametrize("name", ORDER[:-1])
def test_the_summary_ends_with_a_next_link_to_the_following_notebook(name):
    last = markdown(name)[-1]
    closing = [line for line in last.splitlines() if line.startswith("Next: ")]
    assert closing, f"{name}: the last markdown cell has no 'Next: [..](..ipynb)' line"
    assert targets(closing[-1])[:1] == [ORDER[ORDER.index(name) + 1]]


def documents() -> dict[str, str]:
    texts = {f"notebooks/{n}": "\n".join(markdown(n)) for n in NAMES}
    texts["README.md"] = (ROOT / "README.md").read_text()
    texts |= {f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
    return texts


def test_the_tours_route_names_every_notebook_of_the_later_tracks():
    """00's summary walks the tracks after Core; a notebook added to one must appear there
    (07b was missing, and the Spark track ended at 08d)."""
    route = markdown(ORDER[0])[-1]
    named = set(targets(route))
    for first, last in RANGE.findall(route):  # "[08a](...)-[08e](...)": the notebooks between
        named |= set(ORDER[ORDER.index(first):ORDER.index(last) + 1])
    later = [n for track in TRACKS["track"][1:] for n in track["notebooks"]]
    assert [n for n in later if n not in named] == []


def header_minutes(name: str) -> int:
    return int(HEADER.search(markdown(name)[0])["minutes"])


def about(minutes: int) -> str:
    """How the README and the docs write a track's time: "about 70 min", "about 2 h 20 min"."""
    if minutes < 120:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60} min" if minutes % 60 else f"about {minutes // 60} h"


def test_each_tracks_time_is_the_sum_of_its_notebooks_everywhere_it_is_written():
    """The README's track table (each notebook's minutes and the track's), docs/notebooks.md
    and the workshop's self-paced table give a track the sum of its notebooks' headers
    (docs/notebooks.md once said 95 minutes for a track of 115)."""
    readme = (ROOT / "README.md").read_text()
    notebooks_md = (ROOT / "docs" / "notebooks.md").read_text()
    workshop = (ROOT / "docs" / "workshop.md").read_text()
    for track in TRACKS["track"]:
        total = about(sum(header_minutes(n) for n in track["notebooks"]))
        (row,) = [line for line in readme.splitlines() if line.startswith(f"| **{track['name']}**")]
        assert total in row.split("|")[1], (track["name"], total, row[:120])
        for name in track["notebooks"]:
            assert f"{name}.ipynb) {header_minutes(name)} " in row + " ", (name, row[:80])
        assert f"**{track['name']}** " in notebooks_md and re.search(
            rf"\*\*{re.escape(track['name'])}\*\* \([^)]*{total}\)", notebooks_md), \
            (track["name"], total)
        assert re.search(rf"\| {re.escape(track['name'])} \|[^\n]*\| {total} \|", workshop), \
            (track["name"], total)


def test_a_tracks_time_is_written_as_the_docs_write_it():
    assert [about(m) for m in (35, 115, 140, 120)] == [
        "about 35 min", "about 115 min", "about 2 h 20 min", "about 2 h"]


def test_every_link_to_a_notebook_resolves():
    broken = [(where, t) for where, text in documents().items() for t in targets(text)
              if t not in NAMES]
    assert broken == []


def test_every_notebook_named_in_prose_exists():
    """'notebook 08' when only 08a, 08b and 08c exist is a dead end for a learner."""
    numbers = {n.split("_")[0] for n in NAMES}
    unknown = [(where, ref) for where, text in documents().items()
               for m in PROSE_REF.finditer(text) for ref in m.groups() if ref and ref not in numbers]
    assert unknown == []


def test_nbval_markers_are_tags_and_lessons_do_not_talk_about_their_tests():
    in_code = [(n, i) for n in NAMES for i, c in enumerate(read(n).cells)
               if c.cell_type == "code" and "NBVAL" in c.source]
    assert in_code == [], "use the cell tags nbval-ignore-output / nbval-skip"
    talk = re.compile(r"nbval|notebook tests?|compared by the", re.I)
    prose = [(n, m.group(0)) for n in NAMES for text in markdown(n) for m in talk.finditer(text)]
    assert prose == []


def test_the_checks_catch_what_they_look_for():
    """The patterns above find the defects they are for (so an empty result means something)."""
    assert targets("see [08b](08b_spark_kafka_in_and_out.ipynb#3-x) and [x](../notebooks/09_cost.ipynb)") \
        == ["08b_spark_kafka_in_and_out", "09_cost"]
    assert [g for m in PROSE_REF.finditer("the upsert of notebook 08 and notebooks 05 and 06")
            for g in m.groups() if g] == ["08", "05", "06"]
    assert HEADER.search("> **Track:** Core (2 of 8) · **Before this:** [00](00_tour.ipynb) · "
                         "**Time:** ~10 min · **Next:** [02](02_at_least_once.ipynb)")["next"]


def section_words(name: str) -> dict[str, int]:
    """Words per section of a notebook, markdown and code: "opening" before the first "## "
    heading, then one entry per heading ("3" for "## 3. ...", else its title)."""
    words: dict[str, int] = {}
    section = "opening"
    for cell in read(name).cells:
        parts = re.split(r"(?m)^(?=## )", cell.source) if cell.cell_type == "markdown" else [cell.source]
        for part in parts:
            if part.startswith("## "):
                number = re.match(r"## (\d+)\. ", part)
                section = number.group(1) if number else part.splitlines()[0][3:].strip()
            words[section] = words.get(section, 0) + len(part.split())
    return words


def taken(sections: str) -> list[str]:
    """The sections a workshop row takes: "1-4", "1, 2, 4", '"Who takes part", 1-3'."""
    out: list[str] = []
    for item in (i.strip() for i in sections.split(",")):
        if item.startswith('"'):
            out.append(item.strip('"'))
        elif "-" in item:
            first, last = (int(n) for n in item.split("-"))
            out += [str(n) for n in range(first, last + 1)]
        else:
            out.append(item)
    return out


def test_the_workshop_path_fits_90_minutes_and_names_real_sections():
    """Each row's numbers follow from its notebook: the words of the opening and the sections
    taken (at 150 a minute), its cells' seconds (measured with ten learners at once), 15
    minutes for an exercise, the talk; the stops follow the tracks' order; the total is at
    most 90."""
    text = (ROOT / "docs" / "workshop.md").read_text()
    path = text.split("## The path")[1].split("\n## ")[0]
    table = [line for line in path.splitlines() if line.startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]]
    minutes = [int(row[-1]) for row in rows]
    assert sum(minutes) <= 90 and f"Total: {sum(minutes)} minutes." in text
    stops = [row for row in rows if row[0]]
    assert len(stops) >= 6, "a workshop path of at least six stops"
    assert any(row[6].startswith("yes") for row in stops), "learners write code on the day"
    for row in stops:
        (name,) = targets(row[1])
        words = section_words(name)
        missing = [n for n in taken(row[2]) if n not in words]
        assert missing == [], f"{name} has no section(s) {missing}"
        assert int(row[3]) == words["opening"] + sum(words[n] for n in taken(row[2])), \
            f"{name}: the words of its opening and the sections taken"
        reading = int(row[3]) / 150
        assert float(row[4]) == pytest.approx(reading, abs=0.06), f"{name}: words at 150/min"
        run_min = float(row[5]) / 60
        exercise = 15 if row[6].startswith("yes") else 0
        assert int(row[-1]) == -(-(reading + run_min + exercise) // 1) + int(row[7]), name
    names = [targets(row[1])[0] for row in stops]
    assert names == [n for n in ORDER if n in names], "the stops follow the tracks' order"
