"""Wrong consume-transform-produce loops, each a small edit of the lab's reference loop
(``labkit.pipelines.production_loop.fee_service``, plain confluent-kafka), each a mistake
learners and teams make. The judge (``labkit.experiments.judge``) must fail every one with a
finding of its own, on the phase named beside it (the cheapest one that catches it).

    loop = wrong_loop("off-by-one")      # a function the judge runs as it runs a learner's
    WRONG[name].phase, WRONG[name].options, WRONG[name].finding

Each loop is built with ``learner.edited`` (the reference's text with one change, named and
registered as a notebook cell is), so what the judge runs is exactly the diff below.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from labkit import experiments
from labkit.pipelines import learner, production_loop

POSITIONS = "                consumer.position(consumer.assignment()),  # next to read, every partition\n"
SEND_OFFSETS = """            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()),  # next to read, every partition
                consumer.consumer_group_metadata(), 30)
"""
EXCEPT = """        except KafkaException as error:
            if error.args[0].fatal():
                raise  # fenced by a newer instance with our transactional.id: stop
            # abortable, or any other error inside the transaction: give the batch up
            producer.abort_transaction(30)  # drop the output and the offsets...
            rewind(consumer, batch)  # ...and read the batch again
            continue"""
TRANSACTION = """        producer.begin_transaction()
        try:"""
COMMIT = """            crash_point("after-send-offsets-before-commit")
            commit(producer)  # again while its error is retriable"""


@dataclass(frozen=True)
class Wrong:
    """A wrong loop: its edits of the reference, the judge's phase (and options) that
    catches it, and what the judge must find there (an audit count or a finding)."""

    changes: dict[str, str]
    phase: str
    finding: str  # "lost", "duplicated", "aborted_visible" or a judge finding's name
    options: dict = field(default_factory=dict)
    why: str = ""
    # what the same mistake shows instead in the runs where the finding does not (the
    # judge fails the loop either way)
    or_else: tuple[str, ...] = ()

    def shown_in(self, run) -> bool:
        """The judge found this mistake's finding, or what it shows instead."""
        return bool({self.finding, *self.or_else} & found(run))

    def crash_at_fired(self, run) -> bool:
        """Its crash point (if it has one) was reached: the mistake was exercised."""
        points = self.options.get("crash_at")
        return points is None or any(p in run.crashed for p in points.split(","))


WRONG: dict[str, Wrong] = {
    "one-partition-offsets": Wrong(
        {POSITIONS: "                [TopicPartition(batch[-1].topic(), batch[-1].partition(),\n"
                    "                                batch[-1].offset() + 1)],  # one partition\n"},
        "point", "duplicated", {"crash_at": "after-commit,after-commit"},
        "the offsets of the batch's last partition only: the others are read again"),
    "rewind-one-partition": Wrong(
        {"    for tp in consumer.committed(consumer.assignment(), timeout=30):":
         "    first = batch[0]  # where the batch began\n"
         "    for tp in consumer.committed([TopicPartition(first.topic(), first.partition())],\n"
         "                                 timeout=30):"},
        "offsets", "lost",
        why="an abort rewinds the first record's partition only: the others skip the batch"),
    "offsets-by-the-consumer": Wrong(
        {SEND_OFFSETS: "            consumer.commit(offsets=consumer.position(consumer.assignment()),\n"
                       "                            asynchronous=False)\n"},
        "point", "lost", {"crash_at": "after-send-offsets-before-commit"},
        "offsets committed by the consumer, outside the transaction"),
    "off-by-one": Wrong(
        {POSITIONS: "                [TopicPartition(t, p, o) for (t, p), o in\n"
                    "                 {(m.topic(), m.partition()): m.offset() for m in batch}.items()],\n"},
        "point", "duplicated", {"crash_at": "after-commit"},
        "each partition's last record committed, not the next one to read"),
    "abortable-swallowed": Wrong(
        {EXCEPT: """        except KafkaException as error:
            if error.args[0].fatal():
                raise
            print("error, going on:", error)  # no abort, no rewind
            continue"""},
        "offsets", "abortable-raised",
        why="an abortable error logged and the loop goes on, its transaction never aborted"),
    "fatal-reinit": Wrong(
        {EXCEPT: """        except KafkaException as error:
            if error.args[0].fatal():  # start over with a new producer
                # (the fenced one kept meanwhile: destroyed inside the new one's constructor,
                # its log callback once left an exception set there, SystemError)
                fenced, producer = producer, Producer(client_config({
                    "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                    "connections.max.idle.ms": 5000}))
                producer.init_transactions(30)
                rewind(consumer, batch)
                continue
            producer.abort_transaction(30)
            rewind(consumer, batch)
            continue"""},
        "fenced", "fenced-ran-on",
        why="a fatal error (fenced) taken for one to recover from: a new producer with the "
            "same transactional.id fences the successor in turn"),
    "fatal-abort-and-continue": Wrong(
        {TRANSACTION: """        try:
            producer.begin_transaction()""",
         EXCEPT: """        except KafkaException:
            try:  # any error: abort and read the batch again
                producer.abort_transaction(30)
            except KafkaException:
                pass
            rewind(consumer, batch)
            continue"""},
        "fenced", "fenced-ran-on",
        why="a fatal error (fenced) aborted and retried as if abortable"),
    "revoke-ignored": Wrong(
        {"    consumer.subscribe([input_topic])\n":
         "    consumer.subscribe([input_topic])\n    in_transaction, polls = False, 0\n",
         TRANSACTION: """        if not in_transaction:  # a transaction spans a few polls
            producer.begin_transaction()
            in_transaction, polls = True, 0
        polls += 1
        try:""",
         SEND_OFFSETS: """            if polls < 3:
                continue
""" + SEND_OFFSETS,
         COMMIT: COMMIT + "\n            in_transaction = False",
         "            producer.abort_transaction(30)  # drop the output and the offsets...\n":
         "            producer.abort_transaction(30)  # drop the output and the offsets...\n"
         "            in_transaction = False\n",
         "        if not batch:\n            continue\n": """        if not batch:
            if in_transaction:  # the input paused: what is open is committed
                producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                     consumer.consumer_group_metadata(), 30)
                commit(producer)
                in_transaction = False
            continue
"""},
        "rebalance", "duplicated",
        why="a transaction kept open across polls, committed after a rebalance took its "
            "partitions away",
        # in 3 runs of 30 (stop 47) no record of a moved partition was committed twice; the
        # member that left stopped with its transaction open all the same (hanging)
        or_else=("hanging-transaction",)),
    "new-transactional-id": Wrong(
        {'"transactional.id": transactional_id,':
         '"transactional.id": f"{transactional_id}-{uuid.uuid4().hex[:6]}",',
         "import signal\n": "import signal\nimport uuid\n"},
        "point", "hanging-transaction", {"crash_at": "in-transaction-before-commit"},
        "a transactional.id that changes at every start: nothing fences what a dead "
        "instance left open"),
    "input-read-uncommitted": Wrong(
        {'"isolation.level": "read_committed",': '"isolation.level": "read_uncommitted",'},
        "point", "aborted-input-read", {"crash_at": "after-commit"},
        "the input read read_uncommitted: an upstream transaction's aborted records processed"),
    "commit-before-process": Wrong(
        {'        crash_point("after-poll-before-process")':
         '        consumer.commit(asynchronous=False)  # the batch is ours now\n'
         '        crash_point("after-poll-before-process")'},
        "point", "lost", {"crash_at": "after-poll-before-process"},
        "the input's offsets committed as soon as the batch is polled"),
}


def wrong_loop(name: str) -> Callable:
    """The wrong loop ``name``: the reference with its edits, named ``fee_service_<name>``."""
    return learner.edited(production_loop.fee_service,
                          "fee_service_" + name.replace("-", "_"), WRONG[name].changes)


def judged(name: str, bootstrap: str, **options):
    """The judge's run of wrong loop ``name`` on the phase that catches it."""
    wrong = WRONG[name]
    return experiments.run("judge", pipeline=wrong_loop(name), cluster=bootstrap,
                           phase=wrong.phase, **{**wrong.options, **options})


def found(run) -> set[str]:
    """Everything the judge found: the audit's counts that are not zero, its anomalies, the
    findings beside it."""
    counts = {name for name in ("lost", "duplicated", "aborted_visible")
              if getattr(run.report, name)}
    return counts | set(run.report.anomalies) | set(run.findings)
