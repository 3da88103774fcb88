"""No exercise's answer is on a learner's screen before the exercise, in a heading, in the
notebook's summary, or in the manual (docs/*.md, README.md). Static: reads files only.

An exercise's answer is taken from notebooks/solutions/<name>.md: each line of the solution's
code that the shipped notebook has in none of its code cells (what the learner must write),
each predicted value as its assignment (``my_lost = 5``), and the phrases in ``SAID`` that
give an answer away in words. Each is looked for, spaces collapsed and case ignored, in the
notebook's headings, its markdown before its first exercise, its summary, and every page of
the manual.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.notebook_cells import NAMES, read
from tests.solution_code import SOLUTIONS, exercise_indices, solution_codes

ROOT = Path(__file__).resolve().parents[1]
MIN_LINE = 20  # a solution line shorter than this ("continue") gives nothing away alone
# Answers in words, per notebook: what its solution page says and a summary must not.
SAID: dict[str, tuple[str, ...]] = {
    "01_at_most_once": ("move the commit", "commit below the", "commit after the inserts"),
    "02_at_least_once": ("insert or ignore", "primary key"),
    "03_idempotent_producer": ("one payment at a time", "flush after each payment",
                               "2 producer ids", "5 duplicates"),
    "03b_when_the_broker_fails": ("elected first", "min.insync.replicas ≥ 2",
                                  "min.insync.replicas=2 loses no"),
    "03c_when_the_network_takes_sides": ("5 lost", "loses 5", "lose 5"),
    "04_transactions": ("3 + 2 + 1 data records and 3 markers",),
    "05d_the_outbox": ("both, or neither",),
    "07b_what_a_crash_costs_kafka_streams": ("never left the memtable",
                                             "never leave the memtable", "restored in full"),
    "08b_spark_kafka_in_and_out": ("options whose names start with", "without the prefix"),
    "08e_spark_real_time_mode": ("key each record by its id", "key each record by that id"),
    "12_your_own_pipeline": ("send_offsets_to_transaction(consumer.position",),
}
# Answers a heading must not name, though the text may (03b's section 4 runs with
# min.insync.replicas=2 and unclean election off; the exercise asks with it on).
IN_HEADINGS: dict[str, tuple[str, ...]] = {"03b_when_the_broker_fails": ("min.insync.replicas=2",)}
# Leaks in notebooks other lessons' owners write; strict: once fixed, the entry must go.
# (05's, which issue 41 names, is no text: the notebook shows the right settings' effects
# above its exercise, which a phrase cannot find.)
KNOWN_LEAKS: dict[str, str] = {}


def normal(text: str) -> str:
    return " ".join(text.split()).lower()


def code_lines(nb) -> set[str]:
    return {normal(line.split("  #")[0]) for cell in nb.cells if cell.cell_type == "code"
            for line in cell.source.splitlines()}


def answers(name: str) -> list[str]:
    """What gives ``name``'s exercises away: solution lines the notebook does not show, each
    predicted value as its assignment, and ``SAID``."""
    shipped = code_lines(read(name))
    found: list[str] = []
    for block in solution_codes(name):
        tree = ast.parse(block)
        if all(isinstance(node, ast.Assign) for node in tree.body):  # a prediction
            found += [normal(ast.unparse(node)) for node in tree.body]
            continue
        for line in block.splitlines():
            line = normal(line.split("  #")[0])
            if len(line) >= MIN_LINE and line not in shipped:
                found.append(line)
    return found + [normal(phrase) for phrase in SAID.get(name, ())]


def places(name: str) -> dict[str, str]:
    """Where a learner reads before (or instead of) an exercise: the notebook's headings,
    its markdown above its first exercise, its summary; and the manual."""
    nb = read(name)
    first = exercise_indices(nb)[0]
    found = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        headings = [line for line in cell.source.splitlines() if line.startswith("#")]
        if headings:
            found[f"{name} cell {i} (heading)"] = "\n".join(headings)
        if i < first:
            found[f"{name} cell {i} (above the exercise)"] = cell.source
        if cell.source.startswith("## Summary"):
            found[f"{name} cell {i} (summary)"] = cell.source
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found[str(page.relative_to(ROOT))] = page.read_text()
    return found


def leaks(answers_: list[str], places_: dict[str, str],
          in_headings: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    return [(where, answer) for where, text in places_.items()
            for answer in [*answers_, *(normal(h) for h in in_headings
                                        if where.endswith("(heading)"))]
            if answer in normal(text)]


EXERCISED = [n for n in NAMES if (SOLUTIONS / f"{n}.md").exists()]


def test_every_notebook_with_an_exercise_is_scanned():
    assert EXERCISED == NAMES
    assert set(SAID) <= set(NAMES) and set(KNOWN_LEAKS) <= set(NAMES)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    strict=True, reason=KNOWN_LEAKS[n])) if n in KNOWN_LEAKS else n for n in EXERCISED])
def test_no_answer_before_or_outside_its_exercise(name):
    found = answers(name)
    assert found, f"{name}: no answer text found in its solution page"
    assert leaks(found, places(name), IN_HEADINGS.get(name, ())) == []


def test_a_planted_leak_is_found_where_it_was_planted():
    """The scan can fail: 03b's answer planted in a summary, a heading and a docs page is
    found in each, and only there."""
    found = answers("03b_when_the_broker_fails")
    assert "my_min_insync = 2" in found
    planted = {"summary": "## Summary\n\n* Set my_min_insync = 2, and unclean elections are "
                          "harmless: eligible leader replicas are elected first.",
               "heading": "## 4. acks=all and min.insync.replicas=2 loses no record",
               "docs/x.md": "The exercise: my_min_insync =   2 (spaces do not hide it).",
               "clean": "## 5. An unclean election: loss even with acks=all"}
    where = {w for w, _ in leaks(found, planted)}
    assert where == {"summary", "heading", "docs/x.md"}
    # a setting a heading must not name: found in a heading, not in the text
    named = {"03b cell 10 (heading)": "## 4. acks=all and min.insync.replicas=2: nothing lost",
             "03b cell 11 (above the exercise)": "`min.insync.replicas=2` on the topic says"}
    assert leaks([], named, IN_HEADINGS["03b_when_the_broker_fails"]) == [
        ("03b cell 10 (heading)", "min.insync.replicas=2")]


def test_solution_lines_count_only_what_the_notebook_does_not_show():
    """A line the notebook shows already (01's commit line, moved by the solution) is no
    answer; a line only the solution has is (02's table with a key)."""
    assert not any("consumer.commit(message=batch[-1]" in a for a in answers("01_at_most_once"))
    assert any(re.search(r"primary key", a) for a in answers("02_at_least_once"))
