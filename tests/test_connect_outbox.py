"""The outbox read by Debezium's PostgreSQL connector on a real Kafka Connect worker, the
worker SIGKILLed mid-stream and restarted (the ``outbox`` experiment), judged from the topic
by the audit: an at-least-once worker sends again what came after its stored offsets, an
exactly-once worker (KIP-618) keeps each event once. Before it, the dual write (the
``dual-write`` experiment): the same service writing its table and Kafka one after the
other loses events or duplicates them when killed in between.
"""
from __future__ import annotations

from collections import Counter

from labkit import experiments
from labkit.kafka import connect, topics
from labkit.storage.debezium import lsn_text

# 200 payments before the commit point, then 600 written at 200 a second; the worker is
# killed once 150 of those are in the topic, while the service goes on writing.
FIRST, SECOND, RATE, KILL_AFTER = 200, 600, 200.0, 150


def outbox_crash(exactly_once: bool):
    return experiments.run("outbox", exactly_once=exactly_once, first=FIRST, second=SECOND,
                           rate=RATE, kill_after=KILL_AFTER, announce=lambda line: None)


def no_worker_left(run) -> bool:
    return [cmd for cmd in connect.workers_left() if run.source.name in cmd] == []


def test_an_at_least_once_worker_killed_sends_again_what_came_after_its_stored_offsets(
        bootstrap, pg_dsn):
    run = outbox_crash(exactly_once=False)
    assert no_worker_left(run)
    assert run.faults[0].what.startswith("SIGKILL the Connect worker")
    report = run.report
    # counted by the audit from the topic (read_committed): every event there, and twice
    # exactly those the killed worker had sent after its stored offsets
    assert report.lost == 0 and report.delivered_unique == FIRST + SECOND
    assert len(run.sent_by_killed) >= KILL_AFTER
    assert report.duplicated == len(run.sent_by_killed) == run.resent
    twice = {i for i, n in Counter(r.value["id"] for r in run.committed).items() if n == 2}
    assert twice == set(run.sent_by_killed)
    # what Connect kept before the kill: one offsets record, the position after FIRST, the
    # same in its offsets topic and from its REST API; none written for what came after
    [stored] = run.stored_at_kill
    assert stored.committed and stored.partition == {"server": run.source.slot}
    assert run.rest_before_kill == [{"partition": stored.partition, "offset": stored.offset}]
    # PostgreSQL's slot was confirmed up to that commit only: the WAL after it was kept
    assert run.slot_at_kill["confirmed_flush_lsn"] == lsn_text(stored.offset["lsn_commit"])
    assert run.open_before_kill == [] and run.open_after_kill == []  # no transactions at all
    assert not any(p.open_transaction for p in run.producers_before_kill)
    # Debezium found that position and resumed right after it
    assert any(f"last change LSN 'LSN{{{lsn_text(stored.offset['lsn'])}}}'" in line
               for line in run.resume_lines), run.resume_lines
    # the outbox event router keyed each record by the row's aggregateid (the account)
    assert all(r.key == r.value["key"] for r in run.committed)


def test_an_exactly_once_worker_killed_keeps_each_event_once(bootstrap, pg_dsn):
    run = outbox_crash(exactly_once=True)
    assert no_worker_left(run)
    report = run.report
    assert report.lost == 0 and report.duplicated == 0
    assert report.delivered_unique == FIRST + SECOND and report.aborted_visible == 0
    # what the killed worker had sent after its stored offsets was sent again, as with
    # at-least-once, but its first copies belong to the transaction the kill left open:
    # aborted, in the log, unseen by read_committed
    assert len(run.sent_by_killed) >= KILL_AFTER
    assert run.resent == len(run.sent_by_killed) == report.aborted_in_log
    # the open transaction at the kill: the task's transactional id, on the events topic
    # (its offsets join the transaction only when it commits)
    task_id = run.worker_names.task_transactional_id(run.source.name)
    assert [(t.transactional_id, t.partitions) for t in run.open_before_kill] == \
        [(task_id, ((run.source.topic, 0),))]
    assert [t.transactional_id for t in run.open_after_kill] == [task_id]  # SIGKILL ends nothing
    # the partition leader's view (DescribeProducers): that producer's open transaction
    # begins right after the first batch and its commit marker
    [open_here] = [p for p in run.producers_before_kill if p.open_transaction]
    assert open_here.txn_start_offset == FIRST + 1
    [stored] = run.stored_at_kill
    assert stored.committed
    assert run.slot_at_kill["confirmed_flush_lsn"] == lsn_text(stored.offset["lsn_commit"])
    # after the restart the re-sent events committed with their offsets, in one transaction
    assert len(run.stored_after) >= 2 and run.stored_after[-1].committed
    assert run.stored_after[-1].offset["lsn"] > stored.offset["lsn"]
    # the run cleaned up: its topic, the worker's three and the slot are gone
    names = run.worker_names
    assert not {run.topics["events"], names.configs, names.offsets, names.statuses} & \
        set(topics.listing(bootstrap))
    assert run.source.slot_state() is None


def test_the_dual_write_loses_or_duplicates_the_events_of_the_batch_killed_in_between(pg_dsn):
    lost = experiments.run("dual-write", order="table-first", announce=lambda line: None)
    assert lost.crashed == ["after-db-commit-before-produce"] and lost.attempts == 2
    # the table holds every payment once; its events lack the crashed batch's ten
    assert (lost.table_rows, lost.table_unique) == (40, 40)
    assert (lost.report.lost, lost.report.duplicated) == (10, 0)
    twice = experiments.run("dual-write", order="kafka-first", announce=lambda line: None)
    assert twice.crashed == ["after-produce-before-db-commit"]
    assert (twice.table_rows, twice.table_unique) == (40, 40)
    assert (twice.report.lost, twice.report.duplicated) == (0, 10)
    calm = experiments.run("dual-write", order="table-first", crash=False,
                           announce=lambda line: None)
    assert (calm.report.lost, calm.report.duplicated, calm.attempts) == (0, 0, 1)
