"""07 · stateful exactly-once: the exercise check.

The learner's running count keeps its store in a SQLite file, which a SIGKILL does not
erase: the restarted instance finds whatever the crashed one wrote there, committed or not.
The check runs the learner's function under exactly_once, crashed once inside the open
transaction (the store updated, the offsets not yet committed) and once right after the
commit (the two runs side by side), and audits the output and the last count per account. A wrong answer gets the
measured drift and a question, never the code.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from labkit import experiments
from labkit.exercises import Verdict, check, exercise, not_changed, what_it_raised
from labkit.pipelines import learner

SCENARIO = "running-count"
GUARANTEE = "exactly_once"
RECORDS = 40
# inside the open transaction (the store ahead of what committed), then after the commit
POINTS = ("after-state-update-before-commit", "after-commit")


def drift(report) -> tuple[int, int]:
    """(payments counted too often, payments missing) over every account's last count."""
    diffs = [report.state_actual.get(k, 0) - n for k, n in report.state_expected.items()]
    return sum(d for d in diffs if d > 0), -sum(d for d in diffs if d < 0)


def run_crashed(count: Callable, point: str, bootstrap: str | None):
    return experiments.run(SCENARIO, guarantee=GUARANTEE, crash_at=point, records=RECORDS,
                           pipeline=count, cluster=bootstrap, keep_topics=False)


@exercise("07_stateful_exactly_once")
def check_store_on_disk(count: Callable, bootstrap: str | None = None) -> Verdict:
    """07 · the learner's running count with its store on disk: exact after a crash inside
    the transaction and after one right behind the commit?"""
    refused = not_changed(count, "count_on_disk")
    if refused:
        return refused
    missing = [p for p in POINTS if p not in learner.crash_points_in(count)]
    if missing:
        return check(False, "", f"{count.__name__} no longer calls crash_point() at "
                                f"{', '.join(missing)}: keep those lines where they were, so "
                                "the lab can kill it there.")
    with ThreadPoolExecutor(len(POINTS)) as pool:  # side by side: each mostly waits
        runs = {point: pool.submit(run_crashed, count, point, bootstrap) for point in POINTS}
    for point in POINTS:  # judged in order: inside the transaction first
        try:
            report = runs[point].result().report
        except Exception as exc:  # the learner's code, run as the worker: what it raised
            return check(False, "", f"the run crashed at {point} failed: {what_it_raised(exc)}")
        if report.lost or report.duplicated:
            return check(False, "", f"crashed at {point}, the output itself is off "
                                    f"(lost={report.lost}, duplicated={report.duplicated}): keep "
                                    "the output, the changelog and the offsets in one transaction.")
        over, under = drift(report)
        if over:
            return check(False, "", f"crashed at {point}, the counts are {over} payments too "
                                    "high: the restarted instance counted a batch on top of a "
                                    "store that already held it, although that batch's "
                                    "transaction was aborted. Which copy of the counts holds "
                                    "only what committed, and what is the file on disk next "
                                    "to it?")
        if under:
            return check(False, "", f"crashed at {point}, the counts are {under} payments too "
                                    "low: the restarted instance started from less than had "
                                    "committed. Where are the committed counts kept?")
    return check(True, "crashed inside the transaction and right after the commit, every "
                       "account's count matched its payments, and the output held each payment "
                       "once. Kafka Streams does the same under exactly_once_v2 before 4.4 "
                       "(07b measures what it costs).", "")
