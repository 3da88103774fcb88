"""The exercise checks of notebooks 04-06 pass the right answer and refuse a wrong one,
measured on the real broker; plus the side-effect ledger notebook 05 audits."""
from __future__ import annotations

from labkit.checking import audit

from labkit import experiments
from labkit.experiments import scenarios
from labkit.exercises.ctp import COMMITTED, check_rewind
from labkit.exercises.transactions import check_transactions
from labkit.exercises.zombies import check_fenced_zombie, check_next_epoch, replay_takeover
from labkit.pipelines import consumer
from tests.notebook_cells import as_cell, read
from tests.solution_code import exercise_indices, solution_code, solution_codes

CTP = "consume-transform-produce"


def test_transactions_check_counts_markers(bootstrap):
    assert not check_transactions(bootstrap, None, None).passed
    # 3 data + COMMIT, 2 data + ABORT, 1 data + COMMIT: the last record at 7, HW 9.
    assert check_transactions(bootstrap, 9, 7).passed
    wrong = check_transactions(bootstrap, 6, 5)  # data only, markers forgotten
    assert not wrong.passed and "one marker per partition" in wrong.message
    assert not {"9", "7"} & set(wrong.message)  # a hint, not the answer
    assert "high watermark is right" in check_transactions(bootstrap, 9, 5).message


def shipped_rewind():
    """05's exercise cell as shipped: the one-partition rewind."""
    nb = read("05_consume_transform_produce")
    (index,) = exercise_indices(nb)
    return as_cell(nb.cells[index].source, "rewind")


def test_the_rewind_check_finds_the_partitions_a_one_partition_rewind_skips(bootstrap):
    """The shipped rewind seeks back the first record's partition only: the other two of
    the aborted batch resume at their end, their records lost; the check says which and
    where they began, never how to seek them."""
    wrong = check_rewind(bootstrap, shipped_rewind())
    assert not wrong.passed
    lost = [p for p, began in COMMITTED.items()
            if f"partition {p} resumed at offset 6, but the aborted transaction began there "
               f"at {began}" in wrong.message]
    assert len(lost) == 2 and "(lost)" in wrong.message, wrong.message
    assert not {"committed(", "seek", "assignment"} & set(wrong.message.split())


def test_the_rewind_check_passes_the_solution_and_refuses_a_rewind_to_the_start(bootstrap):
    assert check_rewind(bootstrap, as_cell(solution_code("05_consume_transform_produce"),
                                           "rewind")).passed
    to_start = as_cell("from confluent_kafka import OFFSET_BEGINNING, TopicPartition\n"
                       "def rewind(consumer, batch):\n"
                       "    for tp in consumer.assignment():\n"
                       "        consumer.seek(TopicPartition(tp.topic, tp.partition, "
                       "OFFSET_BEGINNING))\n", "rewind")
    wrong = check_rewind(bootstrap, to_start)
    # partitions 0 and 2 had committed offsets: reading them from 0 repeats those
    assert not wrong.passed and wrong.message.count("(charged twice)") == 2, wrong.message


def test_the_rewind_check_says_what_to_change_before_running(bootstrap):
    wrong = check_rewind(bootstrap, as_cell("def rewind(consumer):\n    pass\n", "rewind"))
    assert not wrong.passed and "two arguments, (consumer, batch)" in wrong.message


def test_zombie_check_measures_the_next_epoch_and_the_answer_stays(bootstrap):
    assert replay_takeover(bootstrap) == (2, 3)  # B after the double bump, then one bump
    wrong = check_next_epoch(bootstrap, 4)
    assert not wrong.passed and "3" not in wrong.message  # a hint, not the answer
    # a wrong guess, then the right one: the check replays the story, the answer stays 3
    assert check_next_epoch(bootstrap, 3).passed
    assert check_next_epoch(bootstrap, 3).passed


def _group_id_only():
    source = next(c.source for c in read("06_zombies").cells
                  if c.cell_type == "code" and "def group_id_only(" in c.source)
    return as_cell(source, "group_id_only")


def test_the_fenced_zombie_check_passes_the_documented_metadata(bootstrap):
    solution = as_cell(solution_codes("06_zombies")[1], "fenced_metadata")
    verdict = check_fenced_zombie(solution, _group_id_only(), bootstrap)
    assert verdict.passed, verdict.message
    assert "UNKNOWN_MEMBER_ID" in verdict.message


def test_the_fenced_zombie_check_refuses_the_shown_form_and_no_function_without_running():
    shown = _group_id_only()
    unchanged = as_cell(next(c.source for c in read("06_zombies").cells
                             if c.cell_type == "code" and c.source.startswith("# EXERCISE: return")),
                        "fenced_metadata")
    verdict = check_fenced_zombie(unchanged, shown, "127.0.0.1:1")
    assert not verdict.passed and "never joined the group" in verdict.message
    assert "consumer_group_metadata" not in verdict.message  # a hint, not the answer
    assert "your function itself" in check_fenced_zombie(None, shown, "127.0.0.1:1").message


def test_a_side_effect_outside_the_transaction_repeats_after_a_crash(bootstrap, tmp_path):
    ledger = str(tmp_path / "ledger.db")
    run = experiments.run(CTP, guarantee="exactly_once",
                          crash_at="after-send-offsets-before-commit",
                          records=40, cluster=bootstrap,
                          options={"side_effect_db": ledger})
    assert run.report.exactly_once  # the Kafka output is exactly once ...
    side = audit.audit_table(ledger, consumer.SINK_TABLE, run.inputs, "ledger", "exactly_once")
    assert (side.lost, side.duplicated) == (0, scenarios.batch_size(40))  # ... the ledger is not
