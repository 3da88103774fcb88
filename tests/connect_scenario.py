"""The outbox read by Debezium on a Connect worker that is SIGKILLed mid-stream, and the
audit of the topic: what the Connect tests and benchmarks/connect.py run. (It is the part
the outbox experiment will be made of once the registry is restructured, issue 39.)

    result = outbox_crash(bootstrap, dsn, exactly_once=False, first=200, second=600,
                          rate=200, kill_after=150)
    result.report.duplicated            # == len(result.sent_by_killed): all it sent after
                                        # the stored offsets, sent again
    result.source, result.worker_names  # what it ran (all removed by then)

The run: a worker (its own group and topics), the service's tables and Debezium's slot;
``first`` payments written and streamed, then the connector stopped and resumed (Connect
writes a stopping task's offsets, so the stored position is a known one: after ``first``);
then the service writes ``second`` payments (``rate`` a second, in a thread that goes on
through the kill and the restart: the service never waits for Kafka), the worker is
SIGKILLed once ``kill_after`` of them are in the topic (uncommitted for an exactly-once
worker), restarted (committing every second from then on), and stopped once the connector
has streamed everything and committed it; then the topic is audited. Everything the run made is
removed after.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from labkit.checking import audit
from labkit.kafka import connect, topics
from labkit.kafka.connect import ConnectWorker, StoredOffset
from labkit.kafka.inspect import Inspector
from labkit.storage.debezium import OutboxSource, connect as pg_connect
from labkit.pipelines import data, outbox

VISIBLE_TIMEOUT_S = 60.0
# The restarted worker's offset.flush.interval.ms (an exactly-once connector's transaction
# interval defaults to it): its re-sent records are committed while it runs. The run does
# not count on the clean stop to commit them: once in about 20 runs a SIGTERM right after
# the re-send ended with that transaction aborted, not committed (nothing lost for good:
# its offsets were not committed either, a next start sends them again). Why is not known:
# log4j's shutdown hook had cut the worker's log (now off, labkit.kafka.connect).
RESTART_COMMIT_INTERVAL_MS = 1000


@dataclass
class CrashResult:
    report: audit.AuditReport
    source: OutboxSource
    worker_names: connect.WorkerNames
    exactly_once: bool
    first: int
    second: int
    start_s: float              # the worker's first start
    restart_s: float            # SIGKILL to ready again (the dead member leaves its group first)
    stored_at_kill: list[StoredOffset] = field(default_factory=list)  # the offsets topic
    rest_before_kill: list[dict] = field(default_factory=list)  # GET /connectors/x/offsets
    slot_at_kill: dict | None = None
    open_before_kill: list = field(default_factory=list)   # Ongoing transactions then
    producers_before_kill: list = field(default_factory=list)  # DescribeProducers, events topic
    open_after_kill: list = field(default_factory=list)
    stored_after: list[StoredOffset] = field(default_factory=list)
    sent_by_killed: list[str] = field(default_factory=list)  # ids it sent after the commit point
    resent: int = 0             # records written twice (read_uncommitted)
    resume_lines: list[str] = field(default_factory=list)  # Debezium's "where I resume" log
    committed: list[topics.Rec] = field(default_factory=list)  # the topic, read_committed


def count(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> int:
    return len(topics.read(bootstrap, topic, isolation=isolation))


def wait_count(bootstrap: str, topic: str, n: int, timeout_s: float = VISIBLE_TIMEOUT_S,
               isolation: str = "read_uncommitted") -> int:
    """Until ``topic`` holds at least ``n`` records (read_uncommitted: sent, committed or not);
    how many it holds then (fewer after ``timeout_s``: the audit will say what is missing)."""
    deadline = time.monotonic() + timeout_s
    while (seen := count(bootstrap, topic, isolation)) < n and time.monotonic() < deadline:
        time.sleep(0.3)
    return seen


def wait_stopped(worker: ConnectWorker, name: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while worker.rest.status(name)["connector"]["state"] != "STOPPED":
        if time.monotonic() > deadline:
            raise TimeoutError(f"connector {name} did not stop: {worker.rest.status(name)}")
        time.sleep(0.2)


def outbox_crash(bootstrap: str, dsn: str, *, exactly_once: bool, first: int = 200,
                 second: int = 300, rate: float | None = None, kill_after: int | None = None,
                 home: Path | None = None,
                 commit_interval_ms: int = connect.DEFAULT_COMMIT_INTERVAL_MS) -> CrashResult:
    """``rate``: the service writes the ``second`` payments at that many a second, in a thread
    that goes on through the kill and the restart (None: all at once). The worker is killed
    once ``kill_after`` of them are in the topic (default: all)."""
    run = uuid.uuid4().hex[:8]
    table, payments = f"outbox_{run}", f"payments_{run}"
    source = OutboxSource.named(f"outbox-{run}", dsn, topic=f"outbox-events-{run}", table=table)
    topics.create(bootstrap, source.topic)
    outbox.create_tables(dsn, payments, table)
    records = data.generate(first + second, prefix=f"p{run}")
    worker = ConnectWorker(bootstrap, f"connect-{run}", exactly_once=exactly_once,
                           commit_interval_ms=commit_interval_ms,
                           home=(home / f"connect-{run}") if home else None)
    service = Service(dsn, records[first:], payments, table, rate)
    try:
        source.prepare()
        worker.start()
        start_s = worker.startup_s
        worker.rest.create(source.name, source.connector_config(exactly_once=exactly_once))
        worker.rest.wait_running(source.name)
        source.wait_streaming()
        if first:
            outbox.write(dsn, records[:first], table=payments, outbox=table)
            wait_count(bootstrap, source.topic, first)
            worker.rest.stop(source.name)      # its task writes its offsets as it stops
            wait_stopped(worker, source.name)
            worker.rest.resume(source.name)
            worker.rest.wait_running(source.name)
            source.wait_streaming()
        service.start()
        wait_count(bootstrap, source.topic, first + (second if kill_after is None else kill_after))
        result = CrashResult(audit.AuditReport("outbox", ""), source, worker.names,
                             exactly_once, first, second, start_s, 0.0)
        result.rest_before_kill = worker.rest.offsets(source.name)
        result.open_before_kill = connect.transactions(bootstrap, worker.names, source.name,
                                                       ("Ongoing",))
        with Inspector(bootstrap) as inspector:
            result.producers_before_kill = inspector.producers(source.topic)
        killed = time.monotonic()
        worker.kill()
        # what was stored when it died (read after the kill: a commit just before it counts)
        result.stored_at_kill = connect.stored_offsets(bootstrap, worker.names, source.name)
        result.slot_at_kill = source.slot_state()
        # what the killed worker had sent after the stored offsets: all of it again below
        result.sent_by_killed = [r.value["id"] for r in topics.read(
            bootstrap, source.topic, isolation="read_uncommitted")][first:]
        result.open_after_kill = connect.transactions(bootstrap, worker.names, source.name,
                                                      ("Ongoing",))
        # Restarted with a short commit interval: the long one only had to hold the kill
        # inside its window; now the run need not wait a minute for its next commit.
        worker.commit_interval_ms = RESTART_COMMIT_INTERVAL_MS
        worker.start()
        result.restart_s = round(time.monotonic() - killed, 1)
        worker.rest.wait_running(source.name)
        service.join()
        # Debezium sends again what came after its stored position, then the rest; an
        # exactly-once task commits them at its next transaction boundary
        after = wait_count(bootstrap, source.topic,
                           first + len(result.sent_by_killed) + second)
        result.resent = after - first - second
        wait_count(bootstrap, source.topic, first + second, isolation="read_committed")
        worker.stop()
        result.stored_after = connect.stored_offsets(bootstrap, worker.names, source.name)
        result.resume_lines = worker.log_lines("WAL") + worker.log_lines("no previous LSN")
        result.committed = topics.read(bootstrap, source.topic)
        result.report = audit.audit_topic(
            bootstrap, source.topic, records, "outbox-debezium",
            "exactly_once" if exactly_once else "at_least_once", crash_at="connect-worker-killed")
        return result
    finally:
        service.stop()
        worker.kill()  # its data is thrown away: no graceful stop needed
        source.drop()
        with pg_connect(dsn) as db:
            db.execute(f"DROP TABLE IF EXISTS {table}, {payments}")
        topics.delete(bootstrap, source.topic, worker.names.configs, worker.names.offsets,
                      worker.names.statuses)


class Service:
    """The service writing its payments (and their outbox events) in a thread of its own, at
    ``rate`` a second (None: as fast as it can): it never waits for Kafka or Connect."""

    def __init__(self, dsn: str, records: list[dict], table: str, outbox_table: str,
                 rate: float | None):
        self.args = (dsn, records, table, outbox_table)
        self.rate = rate
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="outbox-service", daemon=True)

    def _run(self) -> None:
        dsn, records, table, outbox_table = self.args
        began = time.monotonic()

        def pace(n: int) -> None:
            if self.halt.is_set():
                raise InterruptedError("the run ended")
            if self.rate:
                time.sleep(max(0.0, began + n / self.rate - time.monotonic()))
        try:
            outbox.write(dsn, records, table=table, outbox=outbox_table, each=pace)
        except BaseException as failed:  # noqa: BLE001 - reported by join()
            self.error = failed

    def start(self) -> None:
        self.thread.start()
        if self.rate is None:
            self.join()

    def join(self, timeout_s: float = 120.0) -> None:
        self.thread.join(timeout_s)
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self.halt.set()
        if self.thread.is_alive():
            self.thread.join(30)
