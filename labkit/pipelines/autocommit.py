"""What auto-commit really commits, measured on the real client.

With ``enable.auto.commit=true`` a background timer commits the *stored* offsets every
``auto.commit.interval.ms``. Which offsets are stored, and when the timer fires relative to
the work, decide what a crash does:

- librdkafka's default (``enable.auto.offset.store=true``): an offset is stored when poll()
  hands the record to the application, before it is processed. A crash after a tick and
  before the work skips records that were never processed; a crash after the work and
  before the next tick repeats them. Neither at-most-once nor at-least-once.
- ``enable.auto.offset.store=false`` and ``store_offsets()`` after the work: the timer
  commits only processed records; a crash never skips, it may repeat (at-least-once). Seen
  after poll k, the committed offset is the end of poll k-1, which is what the Java
  client's auto-commit commits (inside the next poll()).

``Moments`` is the probe a lesson's loop calls at the moments it wants to show: each call
reads where a restarted consumer would resume (the group's committed offset) and how far
the loop has got. ``trace(...)`` is the same measure as a fixed loop, one row per poll.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass

from confluent_kafka import Consumer, TopicPartition

from labkit.kafka import names
from labkit.kafka.clientlog import client_config
from labkit.pipelines.common import committed_offsets

STORE_MODES = ("on-poll", "after-process")


@dataclass(frozen=True)
class PollStep:
    poll: int  # 1, 2, ...
    first_offset: int  # offsets this poll returned
    last_offset: int
    committed: int  # the group's committed offset a few timer ticks after this poll
    processed_through: int  # last offset the application processed (-1: none yet)

    @property
    def unprocessed_committed(self) -> int:
        """Records committed but not processed: what a crash now would skip."""
        return max(0, self.committed - 1 - self.processed_through)


def trace(bootstrap: str, topic: str, polls: int = 5, batch_size: int = 10,
          store: str = "on-poll", interval_ms: int = 100, group_id: str | None = None) -> list[PollStep]:
    """Poll ``topic`` (partition 0) ``polls`` times; after each poll, wait for the timer.

    The application "processes" a batch right *after* its committed offset is read, so each
    row shows the moment a crash is most dangerous: polled, not yet processed.
    """
    if store not in STORE_MODES:
        raise ValueError(f"store must be one of {STORE_MODES}, not {store!r}")
    topic = names.topic(topic)  # a learner's name or the broker's (labkit.kafka.names)
    consumer = Consumer(client_config({
        "bootstrap.servers": bootstrap, "group.id": group_id or f"autocommit-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": True, "auto.commit.interval.ms": interval_ms,
        "enable.auto.offset.store": store == "on-poll", "auto.offset.reset": "earliest",
    }))
    # A fixed assignment, not a group subscription (the other pipelines subscribe): this
    # lesson reads the committed offset between polls, timer tick by timer tick, and a
    # rebalance landing between two polls would commit on its own and blur what it shows.
    consumer.assign([TopicPartition(topic, 0, committed_offsets(consumer, topic, [0])[0])])
    steps: list[PollStep] = []
    processed = -1
    try:
        for k in range(1, polls + 1):
            msgs = [m for m in consumer.consume(batch_size, timeout=10) if m.error() is None]
            if not msgs:
                break
            time.sleep(5 * interval_ms / 1000)  # several timer ticks: the commit has happened
            committed = committed_offsets(consumer, topic, [0])[0]
            steps.append(PollStep(k, msgs[0].offset(), msgs[-1].offset(), max(committed, 0),
                                  processed))
            processed = msgs[-1].offset()  # now "process" the batch
            if store == "after-process":
                consumer.store_offsets(offsets=[TopicPartition(topic, 0, processed + 1)])
    finally:
        consumer.close()
    return steps


def as_rows(steps: list[PollStep]) -> list[dict]:
    """Plain rows (for ``pandas.DataFrame(as_rows(steps))``)."""
    return [{**asdict(s), "unprocessed_committed": s.unprocessed_committed} for s in steps]


@dataclass(frozen=True)
class Moment:
    poll: int  # the how-many-th time the loop reached this moment
    moment: str  # the loop's name for it
    committed: int | None  # the group's committed offset then (None: nothing committed yet)
    done_through: int  # the last offset the loop had processed (-1: none)

    @property
    def restart_at(self) -> int:
        """Where a consumer restarted now resumes: the committed offset, or (none yet) the
        start of the log (``auto.offset.reset=earliest`` on a topic that starts at 0)."""
        return 0 if self.committed is None else self.committed

    @property
    def repeats(self) -> int:
        """Processed records a restart now would process again."""
        return max(0, self.done_through + 1 - self.restart_at)

    @property
    def skips(self) -> int:
        """Records a restart now would never process: committed, not processed."""
        return max(0, self.restart_at - self.done_through - 1)


class Moments:
    """A probe for a consumer loop on screen (one assigned partition): the loop calls
    ``moment(name, consumer, done)`` where it wants to look, ``done`` being the records it
    has processed so far, in order. Each call reads the group's committed offset (a round trip
    to the group coordinator) and changes nothing in the loop or its offsets."""

    def __init__(self) -> None:
        self.seen: list[Moment] = []

    def __call__(self, name: str, consumer: Consumer, done: list) -> None:
        (assigned,) = consumer.assignment()
        tp = TopicPartition(assigned.topic, assigned.partition)
        committed = consumer.committed([tp], timeout=10)[0].offset
        poll = 1 + sum(m.moment == name for m in self.seen)
        self.seen.append(Moment(poll, name, committed if committed >= 0 else None,
                                done[-1].offset() if done else -1))

    def rows(self) -> list[dict]:
        """Plain rows (for ``pandas.DataFrame(moments.rows())``)."""
        return [{**asdict(m), "repeats": m.repeats, "skips": m.skips} for m in self.seen]
