"""The judge tells a transaction no loop could end from one a loop left open
(``judge._stranded``), from what the broker says of it: open, begun before the latest start
of an instance given its transactional.id, no such instance running. That instance's first
call (``init_transactions``) would have aborted it; it was stopped before its code got
there (the capstone's solution under load: a member leaving, SIGTERMed while it started), so
the wait is not the loop's finding. Begun after that start, or with the instance still
running, it stays the loop's."""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from confluent_kafka import Producer

from labkit.experiments import judge
from labkit.kafka import names, topics
from labkit.kafka.clientlog import client_config


class _Pool:
    """The two things the judge asks of its instances: who was given which id, who runs."""

    def __init__(self, transactional_id: str, running: bool):
        self.instances = [SimpleNamespace(kwargs={"transactional_id": transactional_id})]
        self._running = running

    def running(self, i: int) -> bool:
        return self._running


@pytest.fixture
def open_transaction(bootstrap):
    """A transaction left open on a topic of its own: (topic, transactional.id, when the
    open transaction was begun by our clock, seconds)."""
    run = uuid.uuid4().hex[:8]
    topic, tid = names.topic(f"stranded-{run}"), names.topic(f"stranded-{run}-txn")
    topics.create(bootstrap, topic)
    producer = Producer(client_config({"bootstrap.servers": bootstrap, "transactional.id": tid}))
    producer.init_transactions(30)
    producer.begin_transaction()
    before = time.time()
    producer.produce(topic, value=b"left open")
    producer.flush(30)
    try:
        yield topic, tid, before
    finally:
        producer.abort_transaction(30)
        topics.delete(bootstrap, topic)


def _stranded(bootstrap, topic: str, tid: str, started_at: float, running: bool,
              tmp_path: Path) -> set[str]:
    log = tmp_path / "history.jsonl"  # as the supervisor writes it: instance 0 started then
    log.write_text(json.dumps({"t": started_at, "kind": "started", "instance": "0",
                               "attempt": 1}) + "\n")
    run = SimpleNamespace(bootstrap=bootstrap, topics={"output": topic}, history_file=log,
                          clients=SimpleNamespace(pool=_Pool(tid, running)))
    open_now = judge._open_transactions(run)
    assert tid in open_now and open_now[tid] is not None, open_now  # the broker's view
    return judge._stranded(run, {tid: open_now[tid]})


def test_an_instance_stopped_before_its_code_ran_strands_its_predecessors_transaction(
        bootstrap, open_transaction, tmp_path):
    topic, tid, begun = open_transaction
    assert _stranded(bootstrap, topic, tid, begun + 2.0, False, tmp_path) == {tid}


def test_a_transaction_begun_after_the_latest_start_is_the_loops(
        bootstrap, open_transaction, tmp_path):
    topic, tid, begun = open_transaction
    assert _stranded(bootstrap, topic, tid, begun - 2.0, False, tmp_path) == set()


def test_an_instance_still_running_may_end_it_itself(bootstrap, open_transaction, tmp_path):
    topic, tid, begun = open_transaction
    assert _stranded(bootstrap, topic, tid, begun + 2.0, True, tmp_path) == set()
