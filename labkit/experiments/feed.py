"""The input as a service gets it: written while the app works, so production's faults
land on work in progress (the judge's and ``labkit torture --schedule production``'s).

    feed(run, over_s=6.0, aborted=20, instances=2)   # in a thread, while the clients run

It waits until the app's group has formed (every instance with partitions of its own: a
crash point armed in an instance is then reached), then writes the run's records: at once
(``all_at_once``), or three quarters over ``over_s``, then one record at a time while the
run's schedule still has faults to land (each once the group has caught up: there is always
a little work to fault), then the rest after the last fault (what a fenced instance or a
zombie does next is seen too). ``aborted`` more records, with ids of their own, go in two
transactions an upstream producer aborts (at the input's start and in its middle, never at
its end: no consumer commits past an aborted transaction with no record after it): a
consumer reading read_committed never sees them.
"""
from __future__ import annotations

import time

from confluent_kafka import Producer

from labkit.checking import history
from labkit.faults.schedule import Schedule
from labkit.kafka import topics
from labkit.kafka.clientlog import client_config
from labkit.pipelines import data

ABORTED_PREFIX = "aborted"  # the ids of the input's records in aborted transactions
GROUP_FORMED_S = 30.0  # the input waits this long at most for every instance to join
TRICKLE_S = 0.4  # while faults are still to land, a record this often at most
HOLD_S = 180.0  # ... for this long at most


def feed(run, all_at_once: bool = False, over_s: float = 6.0, aborted: int = 0,
         instances: int = 1) -> None:
    group_formed(run, instances)
    # log_level 2: a broker the run kills refuses connections, and the writes wait for it
    producer = Producer(client_config({"bootstrap.servers": run.bootstrap, "log_level": 2,
                                       "enable.idempotence": True, "linger.ms": 5}))
    upstream = _upstream_aborts(run, aborted)
    inputs = run.inputs
    main = len(inputs) if all_at_once else len(inputs) * 3 // 4
    next(upstream)
    step = max(1, main // (2 if all_at_once else 30))
    for start in range(0, main, step):
        _write(run, producer, inputs[start:min(start + step, main)])
        if start < main // 2 <= start + step:  # records follow it in every partition: a
            next(upstream)  # partition never ends in an aborted transaction, which no
        if not all_at_once:  # consumer commits past (its marker is not a record)
            time.sleep(over_s / 30)
    done = main + _trickle(run, producer, inputs[main:])
    tail = inputs[done:]
    each = max(1, len(tail) // 5)
    for start in range(0, len(tail), each):
        _write(run, producer, tail[start:start + each])
        time.sleep(0.4)
    next(upstream, None)


def group_formed(run, members: int, timeout_s: float = GROUP_FORMED_S) -> bool:
    """Until the app's group (``run.progress``) has settled with ``members`` members, every
    partition assigned, ``timeout_s`` at most; whether it has. Input written once a group
    has formed reaches every instance, so each crash point armed in one is reached."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run.progress.formed(members):
            return True
        time.sleep(0.2)
    return False


def write_input(run, records: list[dict], role: str = "input") -> None:
    """``records`` into the run's ``role`` topic, keyed by their key, by an idempotent
    producer (a retry never makes the input the cause of a duplicate)."""
    producer = Producer(client_config({"bootstrap.servers": run.bootstrap,
                                       "enable.idempotence": True, "linger.ms": 5}))
    _write(run, producer, records, role)


def _trickle(run, producer: Producer, rest: list[dict]) -> int:
    """While the schedule has faults to land, a record each time the group has caught up
    (or 3 s went by); a quarter of ``rest`` is kept for after the last fault. How many."""
    schedule = next(iter(run.nemesis.of(Schedule)), None)
    hold_until, done, written_at = time.monotonic() + HOLD_S, 0, time.monotonic()
    keep = max(1, len(rest) // 4)
    while schedule is not None and schedule.pending and time.monotonic() < hold_until \
            and len(rest) - done > keep:
        consumed, end, _ = run.progress.sample()
        if consumed >= end or time.monotonic() > written_at + 3.0:
            _write(run, producer, rest[done:done + 1])
            done, written_at = done + 1, time.monotonic()
        time.sleep(TRICKLE_S)
    return done


def _write(run, producer: Producer, records: list[dict], role: str = "input",
           told: bool = True) -> None:
    """``records`` written and flushed; with ``told`` where each went into the run's history
    (``written``: id -> [partition, offset]): with the group's committed offsets it says
    which records a restart reads again, so an unprocessed record is never counted lost."""
    at: dict[str, list[int]] = {}

    def delivered(err, msg) -> None:
        if err is None:
            at[str(topics.decode(msg.value())["id"])] = [msg.partition(), msg.offset()]

    for r in records:
        producer.produce(run.topics[role], key=str(r["key"]).encode(), value=topics.encode(r),
                         on_delivery=delivered)
    if producer.flush(30):
        raise RuntimeError(f"the lab could not write the run's {role} to {run.topics[role]}")
    if told and at:
        history.append(run.history_file, "written", role=role, at=at)


def _upstream_aborts(run, count: int):
    """Half the ``count`` aborted records in one transaction, aborted, each time it is
    advanced (twice)."""
    partitions = len(topics.partitions_of(run.bootstrap, run.topics["input"]))
    records = data.generate(count, seed=1, keys=data.keys_for(partitions),
                            prefix=ABORTED_PREFIX)
    if not records:
        while True:
            yield
    producer = Producer(client_config({"bootstrap.servers": run.bootstrap, "log_level": 2,
                                       "transactional.id": run.transactional_id("upstream")}))
    producer.init_transactions(30)
    half = (len(records) + 1) // 2
    for part in (records[:half], records[half:]):
        producer.begin_transaction()
        _write(run, producer, part, told=False)  # aborted: never read, never owed
        producer.abort_transaction(30)
        yield
    producer.flush(5)
