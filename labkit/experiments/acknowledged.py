"""A client part: a produce loop whose delivery reports are what the run keeps, for the
experiments that check what a producer was told was written
(``labkit.checking.checks.AcknowledgedWrites``).

    clients=lambda run: AcknowledgingProducer(script, acks=run.o.acks,
                                              settings=run.o.settings or producer_settings,
                                              loop=run.pipeline or write_payments)
    checkers=lambda o: [AcknowledgedWrites("leader-failover", f"acks={o.acks}")]

The producer is made from ``settings(bootstrap, acks)``, the notebook's function or the
experiment's reference one; the lab adds only what watches it (a quiet log level, and with
``track_broker`` a statistics callback). ``loop(producer, topic, payments, acknowledged,
failed)`` is the produce loop, the notebook's (``pipeline=``) or
``labkit.pipelines.delivery_reports.write_payments``: its delivery callback fills
``acknowledged`` (ids) and ``failed`` (error names), and those lists are the producer's
facts: ``acknowledged``, ``not_acknowledged`` (error name -> records), and ``produced``, the
records it was handed.

``script(run, client)`` is the experiment's order of things. It calls ``client.write(records)``
with a generator: the loop asks it for each record, and between two of them the script waits
for the brokers and reports the events its faults fire on (``run.event``); what must happen
while the loop waits for its last answers (flush) is started with ``client.meanwhile``.

Which broker acknowledged a record (``track_broker``): the broker the producer was sending
the partition to (librdkafka's statistics, every 100 ms: the partition's ``broker``) at the
first sample served after the loop's callback noted the acknowledgement; a producer sends a
partition's records only to that broker. Statistics and delivery reports wait in one queue
and are served in order, so each sample knows how many acknowledgements came before it. (The
statistics' ``leader`` field lagged behind for seconds when the producer learnt the new
leader from a produce error, and a sample before the acknowledgement can predate the move:
both misnamed the broker in runs under load.)
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from confluent_kafka import Producer

from labkit.pipelines.learner import LearnerCodeError, call, check_parameters, producer_from
from labkit.progress import wait_until

LOOP_GETS = ("producer", "topic", "payments", "acknowledged", "failed")  # what a loop may ask for


class Sample(NamedTuple):
    """One statistics sample: when it was served, the broker the producer was sending the
    partition to, and how many acknowledgements the loop had noted by then."""

    when: float
    broker: int
    acknowledged: int


def check_loop(loop: Callable, _options: Any = None) -> None:
    """A LearnerCodeError, before anything runs, for a loop that asks for what it is not given."""
    check_parameters(loop, set(LOOP_GETS))


class AcknowledgingProducer:
    """The producer under test, made from ``settings``, driven by ``loop`` (see the module's
    docstring). ``acked``: id -> the broker that acknowledged it (with ``track_broker``;
    else None); ``acked_at``: id -> when that was known (monotonic, with ``track_broker``)."""

    def __init__(self, script: Callable[[Any, "AcknowledgingProducer"], None], *, acks: str,
                 settings: Callable[..., dict], loop: Callable, track_broker: bool = False,
                 role: str = "output"):
        self.script, self.acks, self.settings, self.loop = script, acks, settings, loop
        self.role, self.track_broker = role, track_broker
        self.acknowledged: list[str] = []  # filled by the loop's delivery callback
        self.failed: list[str] = []  # likewise: each error's name
        self.acked: dict[str, int | None] = {}
        self.acked_at: dict[str, float] = {}
        self.handed = 0  # records the loop asked for
        self.samples: list[Sample] = []
        self.topic = ""
        self.producer: Producer | None = None
        self._meanwhile: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    def __call__(self, run: Any) -> None:
        self.topic = run.topics[self.role]
        # What the lab adds to watch the producer, never the learner's settings: its log
        # lines here would be about the broken broker's refusals and timeouts (what
        # matters comes back in the delivery reports), its statistics name the broker.
        watching: dict[str, Any] = {"log_level": 2}
        if self.track_broker:
            watching.update({"statistics.interval.ms": 100, "stats_cb": self._statistics})
        self.producer = producer_from(self.settings, run.client_bootstrap, self.acks,
                                      **watching)
        self.script(run, self)
        # acked_by: what the checker (AcknowledgedWrites) reads, in the history
        run.observe(produced=self.handed, acknowledged=len(self.acked),
                    not_acknowledged=dict(Counter(self.failed)), acked_by=dict(self.acked))

    def write(self, records: Iterable[dict]) -> None:
        """The loop, run here over ``records`` (the script's generator); returns once the
        loop has and what ``meanwhile`` started has ended, with ``acked`` known."""
        done = [False]
        try:
            call(self.loop, producer=self.producer, topic=self.topic,
                 payments=self._handed(records, done), acknowledged=self.acknowledged,
                 failed=self.failed)
        finally:
            for thread in self._meanwhile:
                thread.join()
        if self._errors:
            raise self._errors[0]
        if not done[0]:
            raise LearnerCodeError(f"{getattr(self.loop, '__name__', 'the loop')} returned after "
                                   f"{self.handed} payments: it must write every one it is handed")
        if self.track_broker and self.acknowledged:  # a sample after the last acknowledgement
            wait_until(lambda: self.producer.poll(0.1) >= 0 and bool(self.samples)
                       and self.samples[-1].acknowledged >= len(self.acknowledged),
                       "the producer's statistics after its last acknowledgement", 10)
        for i, rid in enumerate(self.acknowledged):
            sample = next((s for s in self.samples if s.acknowledged > i), None)
            self.acked[rid] = sample.broker if sample else None
            if sample is not None:
                self.acked_at[rid] = sample.when

    def meanwhile(self, action: Callable[[], None]) -> None:
        """``action`` on a thread of its own, while the loop waits for its answers; ``write``
        waits for it, and raises what it raised."""
        def run() -> None:
            try:
                action()
            except BaseException as exc:  # raised in the experiment's thread by write
                self._errors.append(exc)

        thread = threading.Thread(target=run, name="acknowledging-meanwhile", daemon=True)
        self._meanwhile.append(thread)
        thread.start()

    def answered(self, within_s: float) -> None:
        """Until every record handed over has its answer in the loop's lists, or ``within_s``."""
        deadline = time.monotonic() + within_s
        while (len(self.acknowledged) + len(self.failed) < self.handed
               and time.monotonic() < deadline):
            time.sleep(0.02)

    def _handed(self, records: Iterable[dict], done: list[bool]) -> Iterator[dict]:
        for record in records:
            self.handed += 1
            yield record
        done[0] = True

    def _statistics(self, text: str) -> None:
        part = (json.loads(text).get("topics", {}).get(self.topic, {}).get("partitions", {})
                .get("0"))
        if part is not None and part["broker"] >= 0:  # -1: between two brokers
            self.samples.append(Sample(time.monotonic(), part["broker"],
                                       len(self.acknowledged)))


def halves(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """The records written before a fault, and those written during it."""
    return records[:len(records) // 2], records[len(records) // 2:]
