"""The crash matrix's exactly-once cells, again and again, under load.

    python benchmarks/matrix_soak.py                 # 10 rounds, 2 busy processes beside
    python benchmarks/matrix_soak.py --rounds 3 --load 0 -k producer
    python benchmarks/matrix_soak.py --file tests/test_groups.py -k exactly_once_in_a_group

The suite (tests/test_pipelines_matrix.py, and tests/test_groups.py for the cells of a
consumer group) runs each cell once. A guarantee that holds
only most of the time shows up here: each round is that test file run by pytest, on a lab
of its own, with its own assertions (real crashes, the real audit), so a failure here is
a failure the suite could have had. Prints one markdown row per cell that ever failed, and
a summary row (rounds, tests run, failures, minutes) for docs/measurements.md.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stress import load  # noqa: E402  (the same busy processes as the stress runs)

ROOT = Path(__file__).resolve().parent.parent
MATRIX = "tests/test_pipelines_matrix.py"


def one_round(test_file: str, selection: str, report: Path) -> tuple[int, Counter[str]]:
    """(tests run, failed test ids) of one pytest run over the selected tests."""
    subprocess.run([sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider",
                    "-k", selection, f"--junitxml={report}"], cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=3600)
    cases = list(ET.parse(report).iter("testcase"))
    failed = Counter(c.get("name") for c in cases
                     if c.find("failure") is not None or c.find("error") is not None)
    return len(cases), failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the runs")
    parser.add_argument("--file", default=MATRIX, help="the test file whose cells to soak")
    parser.add_argument("-k", dest="selection", default="exactly_once",
                        help="pytest's -k over the file's test ids")
    args = parser.parse_args()
    failed: Counter[str] = Counter()
    cells = 0
    started = time.monotonic()
    with load(args.load), tempfile.TemporaryDirectory() as tmp:
        for r in range(1, args.rounds + 1):
            ran, bad = one_round(args.file, args.selection, Path(tmp) / f"round-{r}.xml")
            cells += ran
            failed += bad
            print(f"round {r}/{args.rounds}: {ran} tests, {sum(bad.values())} failed",
                  file=sys.stderr, flush=True)
    for cell, times in sorted(failed.items()):
        print(f"| {cell} | failed {times} of {args.rounds} |")
    minutes = (time.monotonic() - started) / 60
    print(f"| {args.file} -k {args.selection} | {args.rounds} rounds | {cells} tests run | "
          f"{sum(failed.values())} failed | {minutes:.0f} min |")


if __name__ == "__main__":
    main()
