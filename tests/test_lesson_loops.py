"""The loops notebooks 01, 02, 03, 05 and 06 show are the code their experiments run, and their
lines are what the audit measures: each function is taken from its notebook cell, a line
moved or changed in a copy (the commit before or after the work, the offset sent), and the
copy run through ``experiments.run`` on the real broker. The audit's counts change the way
the lessons say they do.
"""
from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from pathlib import Path

from labkit import experiments
from labkit.pipelines import learner
from tests.notebook_cells import read

# 01's at-most-once loop: the commit line, and the last insert it moves behind
COMMIT_FIRST = "        consumer.commit(message=batch[-1], asynchronous=False)  # 1. commit: the batch counts as done\n"
LAST_INSERT = "        db.executemany(insert, rows[len(rows) // 2:])\n"
# 02's at-least-once loop: the work, the crash point between, the commit
PROCESS = """        for msg in batch:  # 1. process: charge each payment and write it...
            producer.produce(output_topic, key=msg.key(), value=json.dumps(transform(json.loads(msg.value()))))
        producer.flush(30)  # ...and wait until the broker has all of them
"""
BETWEEN = '        crash_point("after-process-before-commit")\n'
COMMIT_AFTER = "        consumer.commit(message=batch[-1], asynchronous=False)  # 2. then commit: next to read = last + 1\n"


def loop_of(notebook: str, name: str, tmp_path: Path, edits: dict[str, str] | None = None) -> Callable:
    """The function ``name`` as its notebook cell defines it (each of ``edits`` applied to the
    cell's text, each found exactly once), imported from a file so the lab can send its text
    to the worker as it sends a cell's."""
    cells = [c.source for c in read(notebook).cells
             if c.cell_type == "code" and f"def {name}(" in c.source]
    assert len(cells) == 1, f"{notebook}: {len(cells)} cells define {name}"
    text = cells[0]
    for old, new in (edits or {}).items():
        assert text.count(old) == 1, f"{notebook}'s {name} no longer has {old!r}"
        text = text.replace(old, new)
    path = tmp_path / f"{name}_{len(list(tmp_path.iterdir()))}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def counts(run) -> tuple[int, int, int]:
    return run.report.delivered_unique, run.report.lost, run.report.duplicated


def test_01_commit_first_loses_half_a_batch_and_moved_after_the_inserts_repeats_it(cluster, tmp_path):
    def crash(loop):
        return experiments.run("consumer", guarantee="at_most_once", crash_at="mid-batch",
                               records=40, pipeline=loop, cluster=cluster)

    shown = crash(loop_of("01_at_most_once", "commit_first", tmp_path))
    # the commit moved from before the inserts to after them: process, then commit
    moved = crash(loop_of("01_at_most_once", "commit_first", tmp_path, {
        COMMIT_FIRST: "", LAST_INSERT: LAST_INSERT + COMMIT_FIRST}))
    assert shown.run.exit_codes == moved.run.exit_codes == [-9, 0]
    # killed with half of batch 2 inserted: its other half is skipped, or the half is repeated
    assert counts(shown) == (35, 5, 0), shown.summary()
    assert counts(moved) == (40, 0, 5), moved.summary()


def test_02_process_then_commit_repeats_a_batch_and_swapped_loses_it(cluster, tmp_path):
    def crash(loop):
        return experiments.run("consume-transform-produce", guarantee="at_least_once",
                               crash_at="after-process-before-commit", records=40,
                               pipeline=loop, cluster=cluster)

    shown = crash(loop_of("02_at_least_once", "process_then_commit", tmp_path))
    # the two steps swapped around the crash point: commit, (killed here), then process
    swapped = crash(loop_of("02_at_least_once", "process_then_commit", tmp_path, {
        PROCESS + BETWEEN + COMMIT_AFTER: COMMIT_AFTER + BETWEEN + PROCESS}))
    assert shown.run.exit_codes == swapped.run.exit_codes == [-9, 0]
    assert counts(shown) == (40, 0, 10), shown.summary()
    assert counts(swapped) == (30, 10, 0), swapped.summary()


def test_05_the_off_by_one_copy_the_notebook_makes_repeats_one_payment(cluster, tmp_path):
    """05 makes its off-by-one with ``edited(fee_service, ...)`` in a cell: that statement,
    run on the loop of 05's cell, gives a copy whose crash repeats one payment; the loop as
    shown, crashed at the same point, repeats none."""
    fee_service = loop_of("05_consume_transform_produce", "fee_service", tmp_path)
    cell = next(c.source for c in read("05_consume_transform_produce").cells
                if c.cell_type == "code" and "off_by_one_service = edited(" in c.source)
    making = next(node for node in ast.parse(cell).body if isinstance(node, ast.Assign)
                  and node.targets[0].id == "off_by_one_service")
    namespace = {"edited": learner.edited, "fee_service": fee_service}
    exec(compile(ast.Module(body=[making], type_ignores=[]), "<05's edit>", "exec"), namespace)

    def crash(loop):
        return experiments.run("consume-transform-produce", guarantee="exactly_once",
                               crash_at="after-poll-before-process", records=40,
                               pipeline=loop, cluster=cluster)

    shown, off_by_one = crash(fee_service), crash(namespace["off_by_one_service"])
    assert counts(shown) == (40, 0, 0), shown.summary()
    assert counts(off_by_one) == (40, 0, 1), off_by_one.summary()
    assert off_by_one.report.examples["duplicated"] == ["r-000010"]


def test_03_the_payments_per_request_on_screen_decide_what_a_lost_ack_duplicates(cluster, tmp_path):
    """03's producer flushes every 5 payments: one Produce request each, so the request whose
    acknowledgement is lost, retried, writes 5 payments twice. The same loop edited to flush
    every 20 payments writes 20 twice."""
    def lost_ack(loop):
        return experiments.run("producer", guarantee="at_least_once", fault="drop-ack:produce:1",
                               records=40, pipeline=loop, cluster=cluster)

    shown = lost_ack(loop_of("03_idempotent_producer", "produce_payments", tmp_path))
    per_20 = lost_ack(loop_of("03_idempotent_producer", "produce_payments", tmp_path, {
        "for start in range(0, len(records), 5):": "for start in range(0, len(records), 20):",
        "records[start:start + 5]": "records[start:start + 20]"}))
    assert counts(shown) == (40, 0, 5), shown.summary()
    assert counts(per_20) == (40, 0, 20), per_20.summary()


def test_06_offsets_that_carry_the_group_id_only_let_the_zombie_commit(cluster, tmp_path):
    """06 §5's group_id_only, as its cell defines it, gives the metadata of a consumer that
    never joined the group: the zombie's offset commit goes through and its batch is written
    twice (the exercise's check runs the metadata that fences it)."""
    run = experiments.run("zombie-rebalance", records=40, cluster=cluster,
                          pipeline=loop_of("06_zombies", "group_id_only", tmp_path))
    assert not run.zombie_error, run.zombie_error  # its commit went through
    assert run.report.duplicated == 10, run.summary()
