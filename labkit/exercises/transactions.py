"""04 · transactions: the exercise checks.

1. The learner's ``book_transfers`` writes each transfer's debit and credit, and learns only
   afterwards whether the transfer was approved. The check runs it on a fresh two-partition
   topic with five transfers, two of them declined, and reads the topic back as a
   ``read_committed`` reader: it must see every leg of each approved transfer once and
   nothing of the declined ones.
2. A prediction: the high watermark and the last record's offset after commit, abort, commit.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable

from labkit.exercises import not_changed, Verdict, check, exercise, unanswered
from labkit.exercises.loops import last_line

# (transfer number, amount, approved by the balance check that answers after both legs)
TRANSFERS = ((1, 100, True), (2, 5000, False), (3, 20, True), (4, 900, False), (5, 7, True))
# book_transfers as the exercise gives it (its fingerprint: tests/test_exercises_04_06.py
# checks the notebook against it): unchanged, nothing runs.
GIVEN = "b692b70562194566"
SETTLE_S = 5.0  # for the last COMMIT markers; a transaction still open after that is a finding


def legs(n: int) -> list[str]:
    return [f"t{n}-debit", f"t{n}-credit"]


def booked(bootstrap: str, book: Callable) -> tuple[list[str], list[str]]:
    """Run ``book`` on a fresh topic with ``TRANSFERS``; what a read_committed reader and a
    read_uncommitted reader then read (ids, in log order). TimeoutError: a transaction was
    left open."""
    from labkit.kafka import names, topics
    from labkit.kafka.inspect import Inspector

    topic = names.topic(f"ex04-transfers-{uuid.uuid4().hex[:8]}")
    topics.create(bootstrap, topic, partitions=2)
    book(bootstrap, topic, names.transactional_id(f"{topic}-bank"),
         [{"n": n, "amount": amount, "approved": ok} for n, amount, ok in TRANSFERS])
    try:
        with Inspector(bootstrap) as inspector:
            inspector.settled_offsets(topic, timeout_s=SETTLE_S)
        return ([r.value["id"] for r in topics.read(bootstrap, topic, "read_committed")],
                [r.value["id"] for r in topics.read(bootstrap, topic, "read_uncommitted")])
    finally:
        topics.delete(bootstrap, topic)


@exercise("04_transactions", "1")
def check_book_transfers(bootstrap: str, book: Callable | None) -> Verdict:
    """04 · 1: a read_committed reader must see each approved transfer's two legs once and
    nothing of a declined one, after ``book`` (the learner's book_transfers) has run."""
    refused = not_changed(book, "", GIVEN, "book_transfers is still the code as given: every reader sees the declined "
                       "transfers. Change it, then run this cell again: the check then runs it.",
                          not_a_function="book_transfers must be a function: def book_transfers("
                       "bootstrap, topic, transactional_id, transfers): ...")
    if refused:
        return refused
    try:
        committed, everything = booked(bootstrap, book)
    except TimeoutError:
        return check(False, "", "book_transfers returned with a transaction still open: a "
                                "read_committed reader waits behind it. How does each of your "
                                "transactions end?")
    except Exception as exc:  # the learner's code, run here: what it raised, briefly
        return check(False, "", f"book_transfers failed: {last_line(f'{type(exc).__name__}: {exc}')}")
    approved = [i for n, _, ok in TRANSFERS if ok for i in legs(n)]
    declined = [n for n, _, ok in TRANSFERS if not ok
                if set(legs(n)) & set(committed)]
    missing = [n for n, _, ok in TRANSFERS if ok and not set(legs(n)) <= set(committed)]
    twice = sorted({i for i in committed if committed.count(i) > 1})
    if declined:
        return check(False, "", f"a read_committed reader sees declined transfer(s) "
                                f"{', '.join(map(str, declined))}. Their legs were sent before the "
                                "balance check answered: what makes records already sent invisible "
                                "to such a reader?")
    if missing:
        return check(False, "", f"a read_committed reader misses approved transfer(s) "
                                f"{', '.join(map(str, missing))}, or one of their legs: did what "
                                "wrote them commit?")
    if twice:
        return check(False, "", f"a read_committed reader sees {', '.join(twice)} more than once.")
    aborted = len([i for i in everything if i not in approved])
    kept = (f"the declined transfers' {aborted} records are in the log, as aborted data"
            if aborted else "the declined transfers' records never reached the log")
    return check(sorted(committed) == sorted(approved),
                 f"a read_committed reader sees the {len(approved) // 2} approved transfers, both "
                 f"legs each, once; {kept}.",
                 "a read_committed reader sees something other than the approved transfers' legs.")


def run_three_transactions(bootstrap: str, topic: str) -> tuple[int, int]:
    """On a fresh one-partition ``topic``: commit 3 records, abort 2 (flushed), commit 1.

    Returns (high watermark, offset of the last record) as the broker reports them.
    """
    from confluent_kafka import Producer

    from labkit.kafka import names, topics
    from labkit.kafka.clientlog import client_config
    from labkit.kafka.inspect import Inspector

    topic = names.topic(topic)  # the producer below is given the broker's name (labkit.kafka.names)
    topics.create(bootstrap, topic)
    producer = Producer(client_config({"bootstrap.servers": bootstrap,
                                       "transactional.id": f"{topic}-txn"}))
    producer.init_transactions(30)
    acks: list[int] = []
    for n, commit in ((3, True), (2, False), (1, True)):
        producer.begin_transaction()
        for i in range(n):
            producer.produce(topic, key="acct-01", value=topics.encode({"amount": i}),
                             on_delivery=lambda err, msg: acks.append(msg.offset()))
        producer.flush(30)  # abort_transaction() would drop unsent records: send them first
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    with Inspector(bootstrap) as inspector:
        offsets = inspector.settled_offsets(topic)[0]  # the last COMMIT marker included
    return offsets.high_watermark, acks[-1]


@exercise("04_transactions", "2")
def check_transactions(bootstrap: str, high_watermark: int | None,
                       last_offset: int | None) -> Verdict:
    """04 · transactions: predict the high watermark and the last record's offset after
    commit(3 records), abort(2 records), commit(1 record) on an empty partition.

    The check really runs the three transactions on a fresh topic and asks the broker.
    """
    if unanswered(high_watermark) or unanswered(last_offset):
        return check(False, "", "fill in my_high_watermark and my_last_offset, then run this "
                     "cell again. Count the data records, and one offset per marker.")
    hw, last = run_three_transactions(bootstrap, f"ex04-{uuid.uuid4().hex[:8]}")
    if (high_watermark, last_offset) == (hw, last):
        return check(True, f"the broker says high watermark {hw}, last record at offset {last}: "
                           "3 + 2 + 1 data records and 3 markers (COMMIT, ABORT, COMMIT).", "")
    right = [name for name, mine, got in (("high watermark", high_watermark, hw),
                                          ("last offset", last_offset, last)) if mine == got]
    return check(False, "", (f"your {right[0]} is right, the other is not. " if right else
                             "neither number is right yet. ")
                 + "Every transaction ends with one marker per partition, and the aborted "
                 "records stay in the log: they take offsets too. Offsets start at 0.")
