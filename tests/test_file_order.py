"""The suite plans its files' order (tests/file_seconds.py): a table measured from a run
orders the files, longest first unless the cores are full, each file's tests keep their order,
an unmeasured file sits mid-way."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests.file_seconds import TABLE, UNKNOWN_S, sort_as_planned, measured, planned_order


def _items(*nodeids: str) -> list:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_longest_file_first_and_each_files_order_kept(tmp_path: Path):
    table = tmp_path / "seconds.json"
    table.write_text(json.dumps({"tests/test_short.py": 2.0, "tests/test_long.py": 90.0,
                                 "notebooks/05.ipynb": 40.0}))
    items = _items("tests/test_short.py::a", "tests/test_long.py::b", "tests/test_new.py::x",
                   "notebooks/05.ipynb::Cell 0", "tests/test_long.py::a",
                   "notebooks/05.ipynb::Cell 1")
    sort_as_planned(items, table)
    assert [i.nodeid for i in items] == [
        "tests/test_long.py::b", "tests/test_long.py::a", "notebooks/05.ipynb::Cell 0",
        "notebooks/05.ipynb::Cell 1", "tests/test_new.py::x", "tests/test_short.py::a"]
    assert 2.0 < UNKNOWN_S < 40.0


def test_the_table_is_read_from_a_junit_report(tmp_path: Path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.test_a" name="t1" time="1.5"/>'
        '<testcase classname="tests.test_a" name="t2" time="2.0">'
        '<properties><property name="cpu_s" value="1.25"/></properties></testcase>'
        '<testcase classname="notebooks.08a_spark.ipynb" name="Cell 2" time="30.25">'
        '<properties><property name="cpu_s" value="41.0"/></properties></testcase>'
        '</testsuite></testsuites>')
    assert measured(report) == {"notebooks/08a_spark.ipynb": [30.2, 41.0],
                                "tests/test_a.py": [3.5, 1.2]}


def test_a_file_that_waits_runs_beside_a_busy_one_rather_than_two_busy_ones():
    """Two workers on one core: longest first would run both busy files together; the plan
    puts the waiting file beside the first busy one and the second busy one after."""
    files = {"busy_a": (100.0, 90.0), "busy_b": (90.0, 81.0), "waits": (80.0, 8.0)}
    assert planned_order(files, workers=2, cores=1.0) == ["busy_a", "waits", "busy_b"]
    assert planned_order(files, workers=2, cores=2.0) == ["busy_a", "busy_b", "waits"]


def test_the_committed_table_names_files_that_exist():
    root = TABLE.parent.parent
    missing = [path for path in json.loads(TABLE.read_text()) if not (root / path).exists()]
    assert not missing, f"rewrite {TABLE.name} (python -m tests.file_seconds junit.xml): {missing}"
