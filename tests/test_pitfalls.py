"""Well-known mistakes, reproduced on the real broker and caught by the audit."""
from __future__ import annotations

import pytest

from labkit import experiments
from labkit.experiments import scenarios

from labkit.pipelines import data
from labkit.pipelines import autocommit
from labkit.pipelines.guarantee import transactions
from labkit.pipelines.txn import TransactionMisuse

CTP = "consume-transform-produce"
RECORDS = 50
BATCH = scenarios.batch_size(RECORDS)


def run(bootstrap, guarantee, crash_at, **kw):
    return experiments.run(CTP, guarantee=guarantee, crash_at=crash_at,
                           records=RECORDS, cluster=bootstrap, **kw).report


def test_idempotent_producer_alone_still_duplicates_after_a_consumer_crash(bootstrap):
    # Idempotence dedupes the producer's retries within one session; a restarted worker
    # re-reads uncommitted input and produces it again as new records.
    report = run(bootstrap, "at_least_once", "after-process-before-commit",
                 options={"idempotent": True})
    assert (report.lost, report.duplicated) == (0, BATCH)


def test_offsets_committed_outside_the_transaction_before_its_commit_lose_records(bootstrap):
    # The offsets survive, the transaction with the output is aborted by the restart.
    report = run(bootstrap, "exactly_once", "after-send-offsets-before-commit",
                 options={"offsets": "outside-before-commit"})
    assert (report.lost, report.duplicated) == (BATCH, 0)
    correct = run(bootstrap, "exactly_once", "after-send-offsets-before-commit")
    assert correct.exactly_once


def test_offsets_committed_outside_the_transaction_after_its_commit_duplicate(bootstrap):
    report = run(bootstrap, "exactly_once", "after-commit",
                 options={"offsets": "outside-after-commit"})
    assert (report.lost, report.duplicated) == (0, BATCH)


def test_off_by_one_in_send_offsets_redelivers_the_last_record_after_a_restart(bootstrap):
    # Committing the last record's offset (not last + 1): the restart reads it again.
    report = run(bootstrap, "exactly_once", "after-poll-before-process",
                 options={"offset_delta": 0})
    assert (report.lost, report.duplicated) == (0, 1)
    assert report.examples["duplicated"] == [f"r-{BATCH:06d}"]  # the last record of batch 1


def test_read_uncommitted_consumer_sees_aborted_records(bootstrap):
    dirty = run(bootstrap, "exactly_once", "in-transaction-before-commit",
                isolation="read_uncommitted")
    assert dirty.aborted_visible == BATCH and dirty.duplicated == BATCH and dirty.lost == 0
    clean = run(bootstrap, "exactly_once", "in-transaction-before-commit")
    assert clean.aborted_visible == 0 and clean.exactly_once


def test_auto_commit_commits_what_poll_returned_before_it_is_processed(bootstrap, topic_name):
    data.load_into_topic(bootstrap, topic_name, data.generate(40))
    steps = autocommit.trace(bootstrap, topic_name, polls=4, batch_size=10, store="on-poll")
    assert [(s.first_offset, s.last_offset) for s in steps] == [(0, 9), (10, 19), (20, 29), (30, 39)]
    # librdkafka stores an offset when poll() returns the record: the timer commits the
    # records of this very poll, none of them processed yet. A crash now skips them.
    assert [s.committed for s in steps] == [10, 20, 30, 40]
    assert [s.unprocessed_committed for s in steps] == [10, 10, 10, 10]


def test_auto_commit_with_manual_offset_store_commits_the_previous_poll(bootstrap, topic_name):
    data.load_into_topic(bootstrap, topic_name, data.generate(40))
    steps = autocommit.trace(bootstrap, topic_name, polls=4, batch_size=10, store="after-process")
    assert [s.committed for s in steps] == [0, 10, 20, 30]  # the end of the previous poll
    assert [s.unprocessed_committed for s in steps] == [0, 0, 0, 0]
    assert autocommit.as_rows(steps)[1]["committed"] == 10


def test_transactional_api_misuse_gets_a_clear_message(bootstrap, topic_name):
    txn = transactions(bootstrap, f"{topic_name}-tx", init=False)
    with pytest.raises(TransactionMisuse, match=r"call init_transactions\(\) once"):
        txn.begin()
    txn.init()
    with pytest.raises(TransactionMisuse, match=r"only produces inside a transaction"):
        txn.produce(topic_name, "k", {"id": 1})
    with pytest.raises(TransactionMisuse, match=r"no open transaction to commit"):
        txn.commit()
    txn.begin()
    with pytest.raises(TransactionMisuse, match=r"already open"):
        txn.begin()
    txn.abort()
