"""12 · your own pipeline: the harness settings the notebook uses, and the exercise check.

The learner's app is a function in a notebook cell. ``save`` writes the cell's text to a
file outside the repository (``workdir()``), and the harness runs it as a program of its own
(``labkit.torture.apps.function_command``: the kernel's Python, which has confluent-kafka,
calling the function with the run's names), kills it at the same seeded times in the
notebook and in the check, and judges it only by what its output topic shows.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from labkit import proc

from labkit.checking.record import RunRecord
from labkit.pipelines import contract, learner
from labkit.torture import apps, harness
from labkit.exercises import Verdict, check, exercise

# The same torture for the notebook's runs and for the check. 600 records at the apps'
# 10 ms of work each take ~7 s per pass. Each of the 3 kills comes 0.5-1.5 s after the
# app's first offset commit since its last start (kill_clock="commit"), so it lands while
# the app is inside a batch (read, partly written, not yet committed), never while a slow
# start (imports, group join, init_transactions on a loaded machine) is still under way,
# and before the app is done (measured: docs/measurements-harness.md).
TORTURE = {"records": 600, "kills": 3, "seed": 12, "kill_after": (0.5, 1.5),
           "kill_clock": "commit", "timeout": 120}
PREFIX = "own-pipeline-"


def workdir() -> Path:
    """A fresh directory for the learner's app files: a temp dir, never the repository,
    removed when the kernel exits (copy an app you want to keep). A kernel that is killed
    (nbval's, a crashed one) runs no exit hook: its directory, named after its pid, goes
    the next time any kernel asks for one."""
    for left in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        owner = left.name[len(PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not proc.pid_alive(int(owner)):
            shutil.rmtree(left, ignore_errors=True)
    directory = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def save(app: Callable, directory: str | Path) -> Path:
    """The text of the cell that defines ``app``, in ``directory/<name>.py``: the file the
    harness's ``python -m labkit.torture.apps function FILE NAME`` runs."""
    path = Path(directory) / f"{app.__name__}.py"
    path.write_text(learner.code_of(app))
    return path


def torture_function(app: Callable, directory: str | Path, **overrides) -> RunRecord:
    """Run the learner's function ``app`` as an app of its own under the harness, with the
    notebook's settings. The app reads no connection settings: on a cluster with TLS and
    credentials (LABKIT_KAFKA_CONFIG) the harness's proxy stands in front of it
    (``plaintext``)."""
    command = apps.function_command(save(app, directory), app.__name__)
    return harness.torture(command, **{**TORTURE, "plaintext": True, **overrides})


def verdict_lines(result: RunRecord) -> str:
    """What a run showed, in words that stay the same between runs (counts vary with the
    kills' timing; whether there are any does not). ``stalled: N`` only for a run in which
    the app stalled (alive, no progress for the harness's ``stall_s``, then restarted)."""
    r = result.report
    stalled = [f"stalled: {len(result.stalls)}"] if result.stalls else []
    return "\n".join([
        f"kills: {result.kills}, restarts: {result.restarts}",
        *stalled,
        f"input records: {r.produced}, every one in the output: {r.delivered_unique == r.produced}",
        f"lost > 0: {r.lost > 0}",
        f"duplicated > 0: {r.duplicated > 0}",
        f"verdict: {result.verdict}",
    ])


@exercise("12_your_own_pipeline")
def check_own_pipeline(app: Callable | None, directory: str | Path) -> Verdict:
    """12 · make the app exactly once: ``app``, the learner's function, tortured as an app of
    its own with the notebook's kills; its output judged."""
    if not callable(app):
        return check(False, "", "my_fixed_app must be your app's function: def my_fixed_app("
                                "bootstrap, input_topic, output_topic, group_id, "
                                "transactional_id): ...")
    try:
        result = torture_function(app, directory)
    except (contract.HarnessError, learner.LearnerCodeError) as exc:
        first = str(exc).splitlines()[0]
        return check(False, "", f"the harness could not judge your app: {first} (run "
                                "own_pipeline.torture_function(my_fixed_app, app_dir) to see the "
                                "whole message).")
    r = result.report
    if result.kills < TORTURE["kills"]:
        return check(False, "", "your app exited before every kill landed: a streaming app "
                                "keeps running (loop forever) until it is stopped.")
    if r.lost > 0 and r.duplicated > 0:
        return check(False, "", "records were lost and others duplicated: some input offsets "
                                "were committed before their output was in the topic, and some "
                                "output was in the topic before its offsets were committed. A "
                                "kill between the two leaves one without the other.")
    if r.lost > 0:
        return check(False, "", "records are still lost: some input offsets are committed "
                                "before the output they produced is safely in the topic. What "
                                "happens to a batch whose offsets are committed when the kill "
                                "comes before producer.flush()?")
    if r.duplicated > 0:
        return check(False, "", "nothing is lost any more, but there are duplicates: a kill "
                                "after part of a batch's output is in the topic and before its "
                                "offsets are committed leaves that output there for every "
                                "reader, and the restarted app, back at the last committed "
                                "offset, writes it again (at least once). Whichever write "
                                "comes first, a kill can land between the two: what would "
                                "have to become of the output of a batch whose offsets were "
                                "never committed?")
    if r.aborted_in_log == 0:
        # Without transactions a kill inside a batch leaves its written records visible; a
        # run that shows none was lucky with the kills' timing, not exactly once.
        return check(False, "", "no record lost or duplicated this time, but no kill undid "
                                "the output of a batch in progress either (no aborted records "
                                "in the output's log): that was the kills' timing. In an app "
                                "whose output stays once written, a kill between a batch's "
                                "output and its offsets leaves that output there, and the "
                                "replay writes it again: run this cell again.")
    return check(result.verdict == "exactly once",
                 f"exactly once under {result.kills} kills: nothing lost, nothing duplicated "
                 "(aborted transactions stay in the log, invisible to read_committed).",
                 f"the audit says {result.verdict!r}: read its findings with "
                 "own_pipeline.torture_function(my_fixed_app, app_dir).summary().")
