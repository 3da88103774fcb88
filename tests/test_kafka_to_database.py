"""Kafka into PostgreSQL (the ``kafka-to-database`` experiment): a plain consumer as two
instances of one group over three partitions, SIGKILLed on its first batch (and a member
joining), audited by the table. Committing first loses the crashed batch, inserting first
duplicates it; offsets stored in the rows' transaction and the idempotent write keep each
row once, and the idempotent write's running count per account counts the batch again."""
from __future__ import annotations

import pytest

from labkit import experiments
from labkit.storage.db import Database

BATCH = 10  # the crashed instance's first batch: what the mistakes lose or repeat


def run(approach: str, crash_at: str, **options):
    return experiments.run("kafka-to-database", approach=approach, crash_at=crash_at,
                           announce=lambda line: None, **options)


def test_committing_first_loses_the_crashed_batch_and_inserting_first_repeats_it(pg_dsn):
    lost = run("commit-first", "after-commit-before-process", rebalance=False)
    assert lost.crashed == ["after-commit-before-process"]
    assert (lost.report.lost, lost.report.duplicated) == (BATCH, 0)
    # the group committed every offset: Kafka says all 80 were consumed, the table lacks 10
    assert sum(lost.group_offsets.values()) == 80 and lost.report.delivered_unique == 80 - BATCH
    again = run("insert-first", "after-process-before-commit", rebalance=False)
    assert again.crashed == ["after-process-before-commit"]
    assert (again.report.lost, again.report.duplicated) == (0, BATCH)
    assert set(again.offsets_table.values()) == {0}  # both keep their offsets in Kafka
    with Database(pg_dsn) as db:  # each run's schema is dropped when it ends
        assert db.query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'k2db_%'") == []


def test_offsets_in_the_rows_transaction_are_exact_under_crashes_and_a_rebalance(pg_dsn):
    exact = run("offsets-in-database", "in-transaction-before-commit,after-commit",
                totals=True)
    assert sorted(exact.crashed) == ["after-commit", "in-transaction-before-commit"]
    assert exact.faults_fired == ["instance 2 joins the group"]
    report = exact.report
    assert (report.lost, report.duplicated, report.delivered_unique) == (0, 0, 80)
    assert report.state_matches  # the running count moved in the same transaction
    # the position is the database's alone: nothing committed to Kafka, every partition's
    # stored next offset at its end
    assert exact.group_offsets == {}
    assert sum(exact.offsets_table.values()) == 80 and len(exact.offsets_table) == 3


def test_the_idempotent_write_keeps_each_row_once_but_counts_the_replay_again(pg_dsn):
    idem = run("idempotent", "after-process-before-commit", totals=True)
    report = idem.report
    assert idem.crashed == ["after-process-before-commit"] and idem.faults_fired
    assert (report.lost, report.duplicated, report.delivered_unique) == (0, 0, 80)
    # the replayed batch wrote no row, but its accounts were counted again: 10 too many
    over = {k: report.state_actual[k] - n for k, n in report.state_expected.items()}
    assert sum(over.values()) == BATCH and min(over.values()) == 0
    assert "state-drift" in report.anomalies


def test_a_crash_point_off_the_approachs_path_or_one_too_many_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="not on the path of commit-first.*after-commit-"
                                         "before-process"):
        experiments.run("kafka-to-database", approach="commit-first",
                        crash_at="after-process-before-commit")
    with pytest.raises(ValueError, match="3 crash points for 2 instance"):
        experiments.run("kafka-to-database", approach="insert-first",
                        crash_at="mid-batch,mid-batch,after-commit")
