"""The code a lesson shows is the code its experiment runs (labkit.pipelines.learner).

Notebook 05's consume-transform-produce loop is a plain confluent-kafka function in a cell,
and the crash experiment runs that function. Broken in a copy of the notebook (the offsets
committed with the consumer, outside the transaction), the same cells fail nbval: the audit
the lesson shows comes out different, so the lesson cannot pass with code it does not show.
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import nbformat
import pytest

from labkit.pipelines.learner import LearnerCodeError, code_of, diff, edited, run_code
from tests.notebook_cells import NOTEBOOKS, read

ROOT = NOTEBOOKS.parent
SENT_IN_TRANSACTION = """            producer.send_offsets_to_transaction(
                [TopicPartition(last.topic(), last.partition(), last.offset() + 1)],  # next to read
                consumer.consumer_group_metadata(), 30)"""
COMMITTED_OUTSIDE = """            consumer.commit(offsets=[TopicPartition(last.topic(), last.partition(),
                                                    last.offset() + 1)], asynchronous=False)"""
FIRST_AUDIT = "print(one.report.summary())"


def first_crash_copy(broken: bool) -> nbformat.NotebookNode:
    """Notebook 05 up to its first audited crash, its loop cell broken or as shipped."""
    nb = read("05_consume_transform_produce")
    end = next(i for i, c in enumerate(nb.cells) if FIRST_AUDIT in c.source)
    nb.cells = nb.cells[:end + 1]
    loop = next(c for c in nb.cells if c.source.lstrip().startswith("import json")
                and "def fee_service" in c.source)
    assert SENT_IN_TRANSACTION in loop.source, "05's loop no longer sends its offsets as expected"
    if broken:
        loop.source = loop.source.replace(SENT_IN_TRANSACTION, COMMITTED_OUTSIDE)
    return nb


def test_breaking_the_loop_05_shows_makes_its_audit_fail(cluster) -> None:
    paths = {}
    try:
        for broken in (False, True):
            paths[broken] = NOTEBOOKS / f"_05_{'broken' if broken else 'shown'}_{uuid.uuid4().hex[:6]}.ipynb"
            nbformat.write(first_crash_copy(broken), paths[broken])
        out = subprocess.run(
            [sys.executable, "-m", "pytest", *map(str, paths.values()), "--nbval",
             "--nbval-sanitize-with", "notebooks/sanitize.cfg", "-p", "no:cacheprovider",
             "-p", "no:xdist", "-q", "-vv", "-rf", "--lab-home", os.environ["LABKIT_HOME"]],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        for path in paths.values():
            path.unlink(missing_ok=True)
    failed = [line for line in out.stdout.splitlines() if line.startswith("FAILED")]
    # as shown, the copy passes; broken, exactly its audit cell fails, and for the reason
    # the lesson teaches: the batch of the crash is lost
    assert len(failed) == 1 and paths[True].name in failed[0], out.stdout[-4000:]
    assert paths[False].name not in out.stdout.split("short test summary")[-1]
    assert "lost=10" in out.stdout, out.stdout[-4000:]


def test_learner_code_gets_only_the_settings_it_names_and_a_clear_error():
    seen = {}
    code = "def app(bootstrap, input_topic='x'):\n    seen.update(bootstrap=bootstrap, input_topic=input_topic)\n"
    # the learner's module-level names are its own: pass a dict to observe the call
    run_code("seen = __import__('builtins').__dict__.setdefault('_lab_seen', {})\n" + code, "app",
             bootstrap="b:1", input_topic="in", group_id="g")
    import builtins
    seen = builtins.__dict__.pop("_lab_seen")
    assert seen == {"bootstrap": "b:1", "input_topic": "in"}
    with pytest.raises(LearnerCodeError, match=r"asks for \['colour'\].*provides: bootstrap, group_id"):
        run_code("def app(bootstrap, colour):\n    pass\n", "app", bootstrap="b", group_id="g")
    with pytest.raises(LearnerCodeError, match="no function named 'main'"):
        run_code("x = 1\n", "main", bootstrap="b")


def test_the_worker_runs_a_cells_definitions_not_its_calls():
    """An exercise cell defines the learner's function, then calls its check: sent to the
    worker, the call must not run (it would start the check inside the crashed worker)."""
    code = ("import builtins\nLIMIT = int('3')\ndef app(bootstrap):\n"
            "    builtins._lab_seen = (bootstrap, LIMIT)\n"
            "check(app, lab.bootstrap)  # the notebook's check: no 'check' or 'lab' here\n")
    run_code(code, "app", bootstrap="b:1")
    import builtins
    assert builtins.__dict__.pop("_lab_seen") == ("b:1", 3)


def test_an_edited_copy_is_a_function_the_lab_can_send_and_its_diff_is_the_edit(tmp_path):
    module = tmp_path / "shown_app.py"
    module.write_text("def app(bootstrap):\n    step = 1\n    return bootstrap + step\n")
    sys.path.insert(0, str(tmp_path))
    try:
        from shown_app import app
    finally:
        sys.path.remove(str(tmp_path))
    copy = edited(app, "app_by_two", {"step = 1": "step = 2"})
    assert (app(1), copy(1)) == (2, 3)
    # what the worker is sent: the copy's own text
    assert "step = 2" in code_of(copy)
    assert diff(app, copy).splitlines()[-3:] == ["-    step = 1", "+    step = 2",
                                                 "     return bootstrap + step"]
    with pytest.raises(LearnerCodeError, match="occurs 0 times"):
        edited(app, "nope", {"step = 3": "step = 4"})


def test_06s_metadata_function_asking_for_what_the_lab_lacks_is_refused_before_anything_runs(cluster):
    from labkit import experiments

    def metadata(consumer, generation):  # the lab gives consumer, bootstrap and group_id
        return consumer.consumer_group_metadata()

    with pytest.raises(LearnerCodeError, match="provides: bootstrap, consumer, group_id"):
        experiments.run("zombie-rebalance", pipeline=metadata, cluster=cluster.bootstrap)
