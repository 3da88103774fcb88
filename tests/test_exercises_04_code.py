"""04's code exercise: the learner's book_transfers, run on the real broker, judged by what a
read_committed reader sees (the approved transfers' legs once, nothing of the declined)."""
from __future__ import annotations

from labkit.pipelines.learner import fingerprint
from labkit.exercises.transactions import GIVEN, check_book_transfers
from tests.notebook_cells import exercise_function

NOTEBOOK, NAME = "04_transactions", "book_transfers"


def test_the_given_code_is_what_the_check_knows_and_the_solution_passes(bootstrap):
    given = exercise_function(NOTEBOOK, NAME)
    assert fingerprint(given) == GIVEN  # the shortcut is about this very code
    assert "still the code as given" in check_book_transfers(bootstrap, given).message
    right = check_book_transfers(bootstrap, exercise_function(NOTEBOOK, NAME, True))
    assert right.passed, right.message
    assert "sees the 3 approved transfers, both legs each, once" in right.message


def test_declined_transfers_still_visible_get_a_hint_not_the_answer(bootstrap):
    # edited, and still without transactions: every reader sees the declined transfers
    plain = exercise_function(NOTEBOOK, NAME, edits={
        "    producer.flush(30)\n": "    producer.flush(30)\n    producer.flush(1)\n"})
    wrong = check_book_transfers(bootstrap, plain)
    assert not wrong.passed and "sees declined transfer(s) 2, 4" in wrong.message, wrong.message
    assert "abort" not in wrong.message and "transaction" not in wrong.message


def test_a_transaction_left_open_and_an_error_are_named(bootstrap):
    open_txn = exercise_function(NOTEBOOK, NAME, edits={
        '    producer = Producer(client_config({"bootstrap.servers": bootstrap}))\n':
        '    producer = Producer(client_config({"bootstrap.servers": bootstrap,\n'
        '                                       "transactional.id": transactional_id}))\n'
        '    producer.init_transactions(30)\n    producer.begin_transaction()\n'})
    hanging = check_book_transfers(bootstrap, open_txn)
    assert not hanging.passed and "a transaction still open" in hanging.message, hanging.message
    failing = exercise_function(NOTEBOOK, NAME, edits={
        '    producer = Producer(client_config({"bootstrap.servers": bootstrap}))\n':
        '    producer = Producer(client_config({"bootstrap.servers": bootstrap}))\n'
        '    producer.begin_transaction()\n'})
    failed = check_book_transfers(bootstrap, failing)
    assert not failed.passed and failed.message.startswith("book_transfers failed: KafkaException")
    assert "requires transactional.id to be configured" in failed.message  # librdkafka's words
