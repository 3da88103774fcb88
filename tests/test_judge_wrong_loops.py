"""The judge fails each wrong loop of the library (tests/wrong_loops.py) with the finding of
its own, at the named crash point that shows it: the mistakes in what a loop writes, commits
and reads. (The wrong reactions to production's faults: test_judge_reactions.py.)

Each wrong loop is the reference loop (``labkit.pipelines.production_loop.fee_service``)
with one edit, run by the judge as a learner's function is: two instances of one group over
three partitions, the input written once the group has formed, with records of an
upstream's aborted transactions in it."""
from __future__ import annotations

import pytest

from labkit import experiments
from labkit.pipelines import learner, production_loop
from tests.wrong_loops import WRONG, judged, wrong_loop

AT_POINTS = [name for name, w in WRONG.items() if w.phase == "point"]


def test_each_wrong_loop_is_one_edit_of_the_reference():
    for name in WRONG:
        diff = learner.diff(production_loop.fee_service, wrong_loop(name), cell=True)
        changed = [line for line in diff.splitlines()
                   if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        assert 0 < len(changed) <= 40, (name, diff)


@pytest.mark.parametrize("name", AT_POINTS)
def test_a_wrong_loop_fails_at_the_point_that_shows_its_mistake(name, bootstrap):
    run = judged(name, bootstrap)
    assert WRONG[name].crash_at_fired(run), run.summary()
    assert WRONG[name].shown_in(run), (name, run.summary())
    assert not run.report.exactly_once or run.findings, run.summary()


def test_the_reference_loop_passes_the_same_points(bootstrap):
    """The points the wrong loops fail at, two at a time (one per instance): exact, no
    finding, each point reached."""
    points = sorted({p for name in AT_POINTS for p in WRONG[name].options["crash_at"].split(",")})
    for pair in (points[i:i + 2] for i in range(0, len(points), 2)):
        run = experiments.run("judge", cluster=bootstrap, phase="point", crash_at=",".join(pair))
        assert run.report.exactly_once and not run.findings, run.summary()
        assert sorted(run.crashed) == sorted(pair), run.summary()


def test_a_loop_stuck_at_a_record_stopped_short_and_nothing_is_called_lost(bootstrap):
    """A loop that gets stuck at one record (it keeps polling, so stays in its group, and
    never goes on), also after its restart, is audited as it stands: the records after it
    were never processed and its group reads them again, so they are not lost. (Twice in
    fresh clones a right loop that waited on its coordinators was called "lost" this way.)"""
    stuck = learner.edited(production_loop.fee_service, "fee_service_stuck", {
        "        if not batch:\n            continue\n":
        "        if not batch:\n            continue\n"
        "        if any(json.loads(m.value())['id'] == 'r-000060' for m in batch):\n"
        "            while True:  # stuck: it polls (stays in its group), never goes on\n"
        "                consumer.poll(1.0)\n"})
    run = experiments.run("judge", pipeline=stuck, cluster=bootstrap, phase="point",
                          crash_at="after-commit", records=120, instances=1, partitions=3)
    assert run.report.lost == 0 and run.report.unprocessed > 0, run.summary()
    assert "stopped-short" in run.findings, run.summary()
    assert not run.report.anomalies or run.report.duplicated, run.summary()
