"""A learner's transactional producer loop as the benchmark's transactional lane (notebook 09).

The learner writes the loop: begin a transaction, produce each value, commit every so often,
commit at the end::

    def transactional_loop(producer, topic, values, commit_every_ms):
        producer.begin_transaction()
        ...
        producer.commit_transaction()

    bench.compare_guarantees(bootstrap, transactional_loop=transactional_loop)

The lane calls it with its producer (``init_transactions()`` done), its topic, ``values``
(the run's records, each stamped with the clock when the loop takes it, so its latency runs
from there) and ``commit_every_ms``. The producer is the lane's, with two additions: a
delivery report for every record, and ``commit_transaction()`` timed (its flush, then the
commit itself: appendix B of notebook 09).

Paced runs take turns record by record with the other lanes (``lane.run_side_by_side``), so
there the loop runs in a thread of its own that holds the turn from one ``next(values)`` to
the next. A throughput run is one lane alone, as fast as it can: there the loop runs straight
through in the caller's thread (handing a turn over costs tens of microseconds a record).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from labkit.cost.lane import HEADER, Lane, _Run
from labkit.pipelines import learner

# What the loop may name (labkit.pipelines.learner.call passes only what it asks for)
LOOP_PROVIDES = frozenset({"producer", "topic", "values", "commit_every_ms"})
TURN_TIMEOUT_S = 60.0  # a loop that holds its turn this long has stopped asking for records


class LoopLane(Lane):
    """The transactional lane whose runs are the learner's ``loop``."""

    def __init__(self, bootstrap: str, loop: Callable, value_bytes: int = 1024, **options):
        learner.check_parameters(loop, LOOP_PROVIDES)
        super().__init__(bootstrap, "transactional", value_bytes, **options)
        self.loop = loop

    def new_run(self, records: int, records_per_txn: int | None,
                commit_interval_ms: float | None, rate: float | None) -> _Run:
        if records_per_txn is not None:
            raise ValueError("a learner's loop commits by time (commit_every_ms), not every "
                             "N records: leave records_per_txn out")
        return _LoopRun(self, records, None, commit_interval_ms, rate)


class _TimedProducer:
    """The lane's producer as the loop sees it: every call passes through; produce() gets the
    run's delivery report and commit_transaction() is the run's timed commit."""

    def __init__(self, run: "_LoopRun"):
        self._run = run

    def __getattr__(self, name: str):
        return getattr(self._run.producer, name)

    def produce(self, *args, **kwargs) -> None:
        kwargs.setdefault("on_delivery", self._run._on_delivery)
        self._run.producer.produce(*args, **kwargs)

    def commit_transaction(self, *_timeout) -> None:  # the run's own timeouts (30 s)
        self._run._commit()


class _LoopRun(_Run):
    def begin(self, started: int) -> None:
        self.started = self.txn_started = started
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        if self.rate is None:
            return  # a throughput run: the loop runs straight through in end_producing
        self._turn, self._asked = threading.Semaphore(0), threading.Semaphore(0)
        self._thread = threading.Thread(target=self._call, args=(self._taking_turns(),),
                                        name="learner-loop", daemon=True)
        self._thread.start()
        self._wait_for(self._asked)  # the loop has begun and asks for its first record

    def _stamped(self, i: int) -> bytes:
        return HEADER.pack(time.perf_counter_ns(), self.first + i) + self.pad

    def _taking_turns(self) -> Iterator[bytes]:
        for i in range(self.records):
            self._asked.release()  # the loop asks for record i: the turn goes back
            self._turn.acquire()  # ... until send(i) hands it over
            yield self._stamped(i)
        self._asked.release()  # no record left: the last turn is over

    def _call(self, values: Iterator[bytes]) -> None:
        try:
            learner.call(self.lane.loop, producer=_TimedProducer(self), topic=self.lane.topic,
                         values=values, commit_every_ms=self.commit_interval_ms)
        except BaseException as exc:  # raised to the caller in end_producing
            self._failure = exc
        finally:
            if self._thread is not None:
                self._asked.release()  # never leave the caller waiting for a turn

    def _wait_for(self, asked: threading.Semaphore) -> None:
        if not asked.acquire(timeout=TURN_TIMEOUT_S):
            raise RuntimeError(f"{self.lane.loop.__name__}() took no record for "
                               f"{TURN_TIMEOUT_S:.0f} s: iterate over values")
        if self._failure is not None:
            raise self._failure

    def send(self, i: int) -> None:
        if self._thread is not None:
            self._turn.release()
            self._wait_for(self._asked)

    def end_producing(self) -> None:
        if self._thread is None:
            self._call(self._stamped(i) for i in range(self.records))
        else:
            self._thread.join(TURN_TIMEOUT_S)
        if self._failure is not None:
            raise self._failure
        self.left = self.producer.flush(30)
        self.seconds = (time.perf_counter_ns() - self.started) / 1e9
