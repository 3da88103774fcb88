"""The judge on the reference loop, again and again, under load: the soak of issue 40.

    python benchmarks/judge_soak.py                      # 20 schedules and 20 rounds of points
    python benchmarks/judge_soak.py --rounds 3 --load 0 --no-points
    python benchmarks/judge_soak.py --capstone           # the whole verdict for one learner
    python benchmarks/judge_soak.py --wrong-loops        # the capstone's verdict on each wrong loop

Each round is the reference loop (``labkit.pipelines.production_loop.fee_service``) under a
seeded schedule of every kind of production's fault, as the capstone runs it (three
instances, 600 payments, seed = the round; the classic protocol on odd rounds, KIP-848's
on even ones), then (unless ``--no-points``) at its named crash points two at a time and
with the capstone's wire faults. A run passes when the audit is exact and the judge found
nothing beside it. ``--load N`` busy processes run beside. Prints one line per run, then
the markdown rows for docs/measurements.md: passes, and the median and longest seconds of
each phase. ``--capstone``: ``capstone.check_capstone`` on the reference, timed (the judge's
whole time for one learner). ``--wrong-loops``: the capstone's verdict (its finding and its
hint) on each loop of tests/wrong_loops.py.
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from stress import load  # noqa: E402  (the same busy processes as the stress runs)

from labkit import experiments  # noqa: E402
from labkit.exercises import capstone  # noqa: E402
from labkit.faults.production import COMMIT_KILL  # noqa: E402
from labkit.pipelines import production_loop  # noqa: E402

POINTS = ("after-poll-before-process", "mid-batch", "after-produce-before-flush",
          "in-transaction-before-commit", "after-send-offsets-before-commit", "after-commit")


def judged(label: str, results: dict, **options) -> None:
    started = time.monotonic()
    try:
        run = experiments.run("judge", **options)
        passed = run.report.exactly_once and not run.findings
        what = f"{run.verdict}, findings {run.findings or 'none'}, notes {run.notes or 'none'}"
    except Exception as exc:  # a judge error is a failure of the soak too
        passed, what = False, f"ERROR {exc!r}"[:400]
    seconds = round(time.monotonic() - started, 1)
    results[label].append((passed, seconds))
    print(json.dumps({"phase": label, "passed": passed, "seconds": seconds, "what": what,
                      "options": {k: v for k, v in options.items() if k != "pipeline"}}),
          flush=True)


def soak(rounds: int, points: bool) -> dict:
    results: dict[str, list] = defaultdict(list)
    for seed in range(1, rounds + 1):
        protocol = "classic" if seed % 2 else "consumer"
        judged(f"schedule ({protocol})", results, phase="schedule", seed=seed, instances=3,
               records=600, group_protocol=protocol)
        if not points:
            continue
        for pair in (POINTS[i:i + 2] for i in range(0, len(POINTS), 2)):
            judged("points", results, phase="point", crash_at=",".join(pair), seed=seed)
        judged("wire", results, phase="point", fault=capstone.WIRE_RUN, seed=seed)
        judged("committing", results, phase="point", fault=COMMIT_KILL, seed=seed)
    return results


def rows(results: dict) -> str:
    lines = ["| phase | runs | passed | median s | longest s |", "|---|---|---|---|---|"]
    for label, runs in results.items():
        seconds = [s for _, s in runs]
        lines.append(f"| {label} | {len(runs)} | {sum(p for p, _ in runs)} | "
                     f"{statistics.median(seconds):.0f} | {max(seconds):.0f} |")
    return "\n".join(lines)


def one_learner() -> None:
    started = time.monotonic()
    verdict = capstone.check_capstone(production_loop.fee_service, "read_committed")
    print(f"capstone on the reference: passed={verdict.passed} in "
          f"{time.monotonic() - started:.0f} s: {verdict.message}", flush=True)


def wrong_loops() -> None:
    from tests.wrong_loops import WRONG, wrong_loop

    for name in WRONG:
        started = time.monotonic()
        verdict = capstone.check_capstone(wrong_loop(name), "read_committed")
        print(json.dumps({"loop": name, "passed": verdict.passed,
                          "seconds": round(time.monotonic() - started),
                          "message": verdict.message}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the runs")
    parser.add_argument("--no-points", dest="points", action="store_false")
    parser.add_argument("--capstone", action="store_true", help="time the whole verdict")
    parser.add_argument("--wrong-loops", action="store_true",
                        help="the capstone's verdict on each wrong loop")
    args = parser.parse_args()
    started = time.monotonic()
    # a SIGTERM unwinds like Ctrl-C: the busy processes and the run's workers are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with load(args.load):
        if args.capstone:
            one_learner()
        elif args.wrong_loops:
            wrong_loops()
        else:
            print(rows(soak(args.rounds, args.points)))
    print(f"{(time.monotonic() - started) / 60:.1f} minutes, load {args.load}", flush=True)


if __name__ == "__main__":
    main()
