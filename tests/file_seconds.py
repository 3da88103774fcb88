"""How long each test file and notebook took in a whole run, to send the longest first.

pytest-xdist (``--dist loadfile --no-loadscope-reorder``) hands whole files to its workers in
collection order. Its default order, most tests first, left one-test files of two minutes
(production's torture, the solved capstone) to the end, one worker busy and the others idle:
1.5 min of a 29 min run (docs/measurements.md, "Stop 48"). Longest first packs them.

    python -m tests.file_seconds junit.xml   # a run's `--junitxml`, rewrites the table
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")
UNKNOWN_S = 10.0  # a file not in the table yet (about a median file's time)


def measured(junit_xml: Path) -> dict[str, float]:
    """Seconds per file (``tests/x.py``, ``notebooks/x.ipynb``) from a junit report."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "")
        path = (module.replace(".", "/") + ".py" if not module.endswith(".ipynb")
                else module.replace(".", "/", module.count(".") - 1))
        seconds[path] += float(case.get("time", 0))
    return {path: round(s, 1) for path, s in sorted(seconds.items())}


def longest_first(items: list, table: Path = TABLE) -> None:
    """Sorts pytest items so the files that took longest come first; the sort is stable, so
    each file's own order is kept."""
    seconds = json.loads(table.read_text()) if table.exists() else {}
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], UNKNOWN_S))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.file_seconds JUNIT_XML (a run's --junitxml report)")
    TABLE.write_text(json.dumps(measured(Path(sys.argv[1])), indent=0) + "\n")
    print(f"{TABLE}: {len(json.loads(TABLE.read_text()))} files")
