"""11 · share groups: the exercise check.

The learner's share consumer must do each order's work once, although the queue delivers a
record again after the consumer died between the work and its ACCEPT, or froze past its
record lock. The check runs the learner's function as the lab ran the section's loop, both
ways at once (a SIGKILL after the 2nd record's work and a restart; a SIGSTOP there past a
3 s lock and a thaw), and audits the results topic: each order's work once, none skipped.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from labkit.exercises import Verdict, check, exercise, not_changed, what_it_raised
from labkit.pipelines import learner

POINT = "after-process-before-ack"
# the crash of section 3 (40 orders) and the freeze (10 orders, the group's lock 3 s)
RUNS = {"killed and restarted": {"records": 40}, "frozen past its lock": {"records": 10,
                                                                          "freeze": True}}


def _run(function: Callable, bootstrap: str | None, options: dict):
    from labkit import experiments

    return experiments.run("share-group", guarantee="at_least_once", crash_at=POINT,
                           pipeline=function, cluster=bootstrap, keep_topics=False, **options)


@exercise("11_share_groups")
def check_work_once(function: Callable, shown: Callable, bootstrap: str | None = None) -> Verdict:
    """11 · ``function``, the learner's share consumer, killed and frozen between an order's
    work and its ACCEPT: is each order's work in the results topic once? ``shown`` is the
    loop of section 2 (unchanged, it is not run again: its duplicate was measured there)."""
    refused = not_changed(function, "take_orders_once", shown, (
        "take_orders_once is still the loop of section 2, which did one order's work twice in "
        "section 3. Change it, then run this cell again: the check then kills and freezes "
        "your loop."))
    if refused:
        return refused
    if POINT not in learner.crash_points_in(function):
        return check(False, "", f"{function.__name__} no longer calls crash_point(\"{POINT}\"): "
                                "keep that line where it was, so the lab can stop it there.")
    with ThreadPoolExecutor(len(RUNS)) as pool:  # both mostly wait: joins, a lock, the idle end
        futures = {how: pool.submit(_run, function, bootstrap, options)
                   for how, options in RUNS.items()}
        outcomes = {}
        for how, future in futures.items():
            try:
                outcomes[how] = future.result()
            except Exception as exc:  # the learner's code, run as the worker: what it raised
                return check(False, "", f"the run {how} failed: {what_it_raised(exc)}")
    for how, run in outcomes.items():
        report = run.report
        if report.lost or run.archived:
            return check(False, "", f"{how}, {report.lost + run.archived} order(s) never had "
                                    "their work done. An order's work must happen once, not "
                                    "be skipped: which orders may the consumer leave undone?")
        if report.duplicated:
            twice = report.examples["duplicated"][0]
            counts = sorted(a.delivery_count for a in run.attempts
                            if a.id == twice and a.outcome == "processed")
            return check(False, "", f"{how}, order {twice} had its work done twice (delivery "
                                    f"counts {counts}). When the broker delivers an order "
                                    "again, what can your consumer find out about its work "
                                    f"before doing it{', after a restart too' if 'killed' in how else ''}?")
    return check(True, "killed and restarted, then frozen past its lock, your consumer did "
                       "each order's work once: every order in the results topic once, none "
                       "skipped. The queue still delivered records again (delivery count 2); "
                       "your work made the repeat harmless.", "")
