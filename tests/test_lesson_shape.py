"""What a lesson looks like, checked on the notebooks as shipped (their stored outputs): no
markdown cell over 150 words, and no output table wider than 6 columns besides its index,
so a beginner reads each on one screen."""
from __future__ import annotations

import re

import pytest

from tests.notebook_cells import NAMES, read

MAX_WORDS = 150
MAX_COLUMNS = 6


def table_widths(cell) -> list[int]:
    """The data columns (the index aside) of each HTML table a code cell shows: the cells of
    its first body row."""
    widths = []
    for out in cell.get("outputs", []):
        html = "".join(out.get("data", {}).get("text/html", ""))
        for body in re.findall(r"<tbody>\s*<tr>(.*?)</tr>", html, re.S):
            widths.append(len(re.findall(r"<td\b", body)))
    return widths


def test_the_width_is_counted_without_the_index():
    cell = {"outputs": [{"data": {"text/html": (
        "<table><thead><tr><th></th><th>a</th><th>b</th></tr></thead>"
        "<tbody><tr><th>0</th><td>1</td><td>2</td></tr><tr><th>1</th><td>3</td><td>4</td></tr>"
        "</tbody></table>")}}]}
    assert table_widths(cell) == [2]


@pytest.mark.parametrize("name", NAMES)
def test_markdown_cells_and_output_tables_fit_a_screen(name):
    nb = read(name)
    long = [(i, len(c.source.split())) for i, c in enumerate(nb.cells)
            if c.cell_type == "markdown" and len(c.source.split()) > MAX_WORDS]
    assert not long, f"{name}: markdown cells over {MAX_WORDS} words (cell, words): {long}"
    wide = [(i, w) for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for w in table_widths(c) if w > MAX_COLUMNS]
    assert not wide, f"{name}: output tables over {MAX_COLUMNS} columns (cell, columns): {wide}"


# pandas marks a table too wide for its display width with " \" at the end of each cut
# line and prints the other columns below: set pd.set_option("display.width", 120).
WRAPPED = re.compile(r" \\\n")


def wrapped_tables(cell) -> bool:
    return any(WRAPPED.search("".join(out.get("data", {}).get("text/plain", "")))
               for out in cell.get("outputs", [])
               if out.get("output_type") in ("execute_result", "display_data"))


def test_a_wrapped_table_is_found():
    cell = {"outputs": [{"output_type": "execute_result", "data": {"text/plain":
            "   leader  epoch  \\\n0       1      0  \n\n   isr\n0  [1]"}}]}
    assert wrapped_tables(cell) and not wrapped_tables({"outputs": []})


@pytest.mark.parametrize("name", NAMES)
def test_output_tables_are_not_wrapped(name):
    wrapped = [i for i, c in enumerate(read(name).cells)
               if c.cell_type == "code" and wrapped_tables(c)]
    assert wrapped == [], f"{name}: cells whose tables wrap (set a display width): {wrapped}"
