"""Exercise checks of notebooks 01-03 against the real broker (passing and failing paths),
and the labkit pieces those notebooks rely on (scenario watch hook, records_frame, an
acks=0 reset that loses exactly the request it cuts)."""
from __future__ import annotations

import time

from contextlib import contextmanager

from confluent_kafka import Producer

from labkit import experiments

from labkit.kafka import topics
from labkit.exercises.at_least_once import GIVEN, check_books_once
from labkit.exercises.at_most_once import check_loses_nothing
from labkit.exercises.idempotence import check_idempotent_crash, check_keeps_order
from labkit.pipelines.learner import fingerprint
from labkit.faults.proxy import FaultProxy
from labkit.kafka.inspect import describe_topic
from tests.notebook_cells import as_cell, exercise_function, read, shown_function


def test_01_an_unchanged_copy_is_told_so_without_a_run_and_the_solution_loses_nothing(bootstrap):
    shown = shown_function("01_at_most_once", "commit_first")
    unchanged = check_loses_nothing(bootstrap, exercise_function("01_at_most_once", "my_loop"), shown)
    assert not unchanged.passed and "still commit_first" in unchanged.message
    right = check_loses_nothing(bootstrap, exercise_function("01_at_most_once", "my_loop", True),
                                shown)
    assert right.passed, right.message
    # the half batch inserted before the crash at mid-batch is inserted again: the price
    assert "killed at mid-batch: 5 booked twice" in right.message and "at-least-once" in right.message


def test_01_a_commit_still_before_the_last_insert_gets_a_hint_not_the_answer(bootstrap):
    shown = shown_function("01_at_most_once", "commit_first")
    commit = "        consumer.commit(message=batch[-1], asynchronous=False)  # 1. commit: the batch counts as done\n"
    first_insert = "        db.executemany(insert, rows[:len(rows) // 2])  # 2. then insert the rows, in two halves\n"
    between = exercise_function("01_at_most_once", "my_loop", edits={
        commit: "", first_insert: first_insert + commit})  # committed after the first half only
    wrong = check_loses_nothing(bootstrap, between, shown)
    assert not wrong.passed and "killed at mid-batch: 5 lost" in wrong.message, wrong.message
    assert "commit" not in wrong.message.replace("committed", "")  # a question, not the line to move


def test_01_a_loop_without_its_crash_points_or_failing_is_answered_before_or_by_a_run(bootstrap):
    shown = shown_function("01_at_most_once", "commit_first")
    no_points = exercise_function("01_at_most_once", "my_loop", edits={
        '        crash_point("mid-batch")\n': ""})
    missing = check_loses_nothing(bootstrap, no_points, shown)
    assert not missing.passed and "mid-batch" in missing.message
    failing = exercise_function("01_at_most_once", "my_loop", edits={
        "        rows = [": "        raise ValueError('the card check is down')\n        rows = ["})
    failed = check_loses_nothing(bootstrap, failing, shown)
    assert not failed.passed and "ValueError: the card check is down" in failed.message, failed.message


def test_02_the_given_loop_is_what_the_check_knows_and_the_solution_books_each_payment_once(bootstrap):
    given = exercise_function("02_at_least_once", "my_ledger_loop")
    assert fingerprint(given) == GIVEN  # the shortcut below is about this very code
    unchanged = check_books_once(bootstrap, given)
    assert not unchanged.passed and "still the loop as given" in unchanged.message
    right = check_books_once(bootstrap, exercise_function("02_at_least_once", "my_ledger_loop", True))
    assert right.passed and "each of the 40 payments once" in right.message, right.message


def test_02_a_loop_that_still_doubles_or_fails_gets_a_hint_not_the_answer(bootstrap):
    # an edit that changes nothing that matters: the replay still inserts the rows again
    busy = exercise_function("02_at_least_once", "my_ledger_loop", edits={
        "    at_end = False\n": "    at_end = False\n    booked = 0\n"})
    wrong = check_books_once(bootstrap, busy)
    assert not wrong.passed and "killed at after-process-before-commit: 10 booked twice" in wrong.message
    assert "killed at mid-batch: 5 booked twice" in wrong.message
    assert not {"PRIMARY", "IGNORE", "UNIQUE", "key"} & set(wrong.message.split()), wrong.message
    # a key alone: the replay's plain INSERT is refused, and the loop stops with that error
    keyed = exercise_function("02_at_least_once", "my_ledger_loop", edits={
        "(id TEXT, key TEXT": "(id TEXT PRIMARY KEY, key TEXT"})
    refused = check_books_once(bootstrap, keyed)
    assert not refused.passed and "UNIQUE constraint failed" in refused.message, refused.message


def test_03_order_without_idempotence_is_one_acknowledged_payment_at_a_time(bootstrap):
    """The solution (flush after each payment) keeps the order. One request in flight does
    not with librdkafka 2.16: the retried batch still lands behind the next one (the
    solution page says so, measured); idempotence on is refused by the check."""
    shown = shown_function("03_idempotent_producer", "send_payments")
    unchanged = check_keeps_order(bootstrap, exercise_function("03_idempotent_producer",
                                                               "my_send_payments"), shown)
    assert not unchanged.passed and "still send_payments" in unchanged.message
    right = check_keeps_order(bootstrap, exercise_function("03_idempotent_producer",
                                                           "my_send_payments", True), shown)
    assert right.passed and "in order with idempotence off" in right.message, right.message
    in_flight = '"max.in.flight.requests.per.connection": 5,'
    one_in_flight = check_keeps_order(bootstrap, exercise_function(
        "03_idempotent_producer", "my_send_payments",
        edits={in_flight: '"max.in.flight.requests.per.connection": 1,'}), shown)
    assert not one_in_flight.passed and "still out of order (reordered=2)" in one_in_flight.message
    assert "flush" not in one_in_flight.message  # a question, not the fix
    idempotent = check_keeps_order(bootstrap, exercise_function(
        "03_idempotent_producer", "my_send_payments",
        edits={'"enable.idempotence": idempotent,': '"enable.idempotence": True,'}), shown)
    assert not idempotent.passed and "that is idempotence" in idempotent.message


def section_4_loop(edits: dict[str, str] | None = None):
    """03 section 4's idempotent_process_then_commit, its whole cell (imports included) as
    the notebook runs it, each of ``edits`` applied: the loop the exercise 2 check crashes."""
    (source,) = [c.source for c in read("03_idempotent_producer").cells if c.cell_type == "code"
                 and "def idempotent_process_then_commit(" in c.source]
    for old, new in (edits or {}).items():
        assert source.count(old) == 1, f"section 4's cell no longer has {old!r} once"
        source = source.replace(old, new)
    return as_cell(source, "idempotent_process_then_commit")


def test_03_two_producer_ids_and_five_duplicates(bootstrap: str) -> None:
    """Exercise 2's check crashes the loop on screen (section 4's cell) at its mid-batch."""
    loop = section_4_loop()
    assert not check_idempotent_crash(bootstrap, 2, None, loop).passed
    assert check_idempotent_crash(bootstrap, 2, 5, loop).passed
    wrong = check_idempotent_crash(bootstrap, 1, 0, loop)  # hints for both, neither answer
    assert not wrong.passed and "producer id" in wrong.message and "duplicates" in wrong.message
    assert not {"2", "5"} & set(wrong.message)
    half = check_idempotent_crash(bootstrap, 2, 0, loop)  # only the wrong half gets a hint
    assert not half.passed and "producer id" not in half.message and "5" not in half.message


def test_03_the_crash_check_refuses_a_loop_it_cannot_ask_about(bootstrap: str) -> None:
    """Without its mid-batch point the loop is refused before a run; without idempotence
    the run shows no producer id, and the check says so instead of judging the answer."""
    no_point = section_4_loop({'                crash_point("mid-batch")\n': ""})
    refused = check_idempotent_crash(bootstrap, 2, 5, no_point)
    assert not refused.passed and 'crash_point("mid-batch")' in refused.message, refused.message
    plain = section_4_loop({'"enable.idempotence": True': '"enable.idempotence": False'})
    told = check_idempotent_crash(bootstrap, 1, 5, plain)
    assert not told.passed and "without idempotence" in told.message, told.message


def test_watch_sees_existing_topics_while_the_worker_runs(bootstrap: str) -> None:
    seen: dict = {}

    @contextmanager
    def watch(names: dict[str, str]):
        seen["names"] = dict(names)
        seen["before"] = describe_topic(bootstrap, names["input"]).partition(0).high_watermark
        yield
        seen["after"] = describe_topic(bootstrap, names["output"]).partition(0).high_watermark

    run = experiments.run("consume-transform-produce", guarantee="at_least_once",
                          records=20, cluster=bootstrap, watch=watch)
    assert {k: seen["names"][k] for k in run.topics} == run.topics
    assert seen["names"]["history"].endswith("history.jsonl")  # for a live view of the workers
    assert (seen["before"], seen["after"]) == (20, 20)


def test_records_frame_numbers_each_record_of_an_idempotent_producer(bootstrap: str) -> None:
    run = experiments.run("producer", guarantee="at_least_once",
                          fault="drop-ack:produce:1", records=20,
                          cluster=bootstrap, options={"idempotent": True})
    frame = describe_topic(bootstrap, run.topics["output"]).records_frame(
        lambda v: topics.decode(v)["id"])
    assert run.fault_stats["responses_dropped"] == 1
    assert list(frame["sequence"]) == list(range(20)) == list(frame["offset"])
    assert frame["producer_id"].nunique() == 1 and (frame["producer_id"] >= 0).all()
    assert list(frame["value"]) == [f"r-{i:06d}" for i in range(1, 21)]


def test_acks0_reset_loses_only_the_request_it_cuts(bootstrap: str, topic_name: str) -> None:
    """Requests forwarded before the reset reach the log even when pipelined (acks=0)."""
    topics.create(bootstrap, topic_name)
    with FaultProxy(bootstrap) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": 0, "retries": 0,
                             "linger.ms": 0, "enable.idempotence": False})
        # Warm up first: records produced while the connection is still being set up are
        # sent together, in one request, and the fault below would never be reached.
        producer.produce(topic_name, value=topics.encode(-1))
        producer.flush(10)
        time.sleep(0.5)
        proxy.reset("Produce", nth=8)
        for i in range(8):  # one request each, sent back to back without waiting for acks
            producer.produce(topic_name, value=topics.encode(i))
            producer.flush(10)
            time.sleep(0.05)
        stats = proxy.stats()
    assert stats["requests"]["Produce"] == 9 and stats["connections_reset"] == 1
    assert [r.value for r in topics.read(bootstrap, topic_name, "read_uncommitted")] == [-1, *range(7)]
