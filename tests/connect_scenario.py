"""The outbox read by Debezium on a Connect worker that is SIGKILLed mid-stream, and the
audit of the topic: what the Connect tests and benchmarks/connect.py run. (It is the part
the outbox experiment will be made of once the registry is restructured, issue 39.)

    result = outbox_crash(bootstrap, dsn, exactly_once=False, first=200, second=300)
    result.report.duplicated            # 300: everything sent after the stored offsets
    result.source, result.worker_names  # what it ran (all removed by then)

The run: a worker (its own group and topics), the service's tables and Debezium's slot;
``first`` payments written and streamed, then the connector stopped and resumed (Connect
writes a stopping task's offsets, so the stored position is a known one: after ``first``),
``second`` payments streamed, the worker SIGKILLed once all of them are in the topic
(uncommitted for an exactly-once worker), restarted, and stopped cleanly once the connector
has streamed again (so its last transaction is committed), then the topic is audited.
Everything the run made is removed after.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from labkit.checking import audit
from labkit.kafka import connect, topics
from labkit.kafka.connect import ConnectWorker, StoredOffset
from labkit.kafka.debezium import OutboxSource, connect as pg_connect
from labkit.pipelines import data, outbox

VISIBLE_TIMEOUT_S = 60.0


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
    stored_before_kill: list[StoredOffset] = field(default_factory=list)
    rest_before_kill: list[dict] = field(default_factory=list)  # GET /connectors/x/offsets
    slot_before_kill: dict | None = None
    open_before_kill: list = field(default_factory=list)   # Ongoing transactions then
    open_after_kill: list = field(default_factory=list)
    stored_after: list[StoredOffset] = field(default_factory=list)
    resent: int = 0             # records the restarted worker wrote (read_uncommitted)
    resume_lines: list[str] = field(default_factory=list)  # Debezium's "where I resume" log
    committed: list[topics.Rec] = field(default_factory=list)  # the topic, read_committed


def count(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> int:
    return len(topics.read(bootstrap, topic, isolation=isolation))


def wait_count(bootstrap: str, topic: str, n: int, timeout_s: float = VISIBLE_TIMEOUT_S) -> int:
    """Until ``topic`` holds at least ``n`` records (read_uncommitted: sent, committed or not)."""
    deadline = time.monotonic() + timeout_s
    while (seen := count(bootstrap, topic)) < n and time.monotonic() < deadline:
        time.sleep(0.3)
    return seen


def wait_stopped(worker: ConnectWorker, name: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while worker.rest.status(name)["connector"]["state"] != "STOPPED":
        if time.monotonic() > deadline:
            raise TimeoutError(f"connector {name} did not stop: {worker.rest.status(name)}")
        time.sleep(0.2)


def outbox_crash(bootstrap: str, dsn: str, *, exactly_once: bool, first: int = 200,
                 second: int = 300, home: Path | None = None,
                 commit_interval_ms: int = connect.DEFAULT_COMMIT_INTERVAL_MS) -> CrashResult:
    run = uuid.uuid4().hex[:8]
    table, payments = f"outbox_{run}", f"payments_{run}"
    source = OutboxSource.named(f"outbox-{run}", dsn, topic=f"outbox-events-{run}", table=table)
    topics.create(bootstrap, source.topic)
    outbox.create_tables(dsn, payments, table)
    records = data.generate(first + second, prefix=f"p{run}")
    worker = ConnectWorker(bootstrap, f"connect-{run}", exactly_once=exactly_once,
                           commit_interval_ms=commit_interval_ms,
                           home=(home / f"connect-{run}") if home else None)
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
        outbox.write(dsn, records[first:], table=payments, outbox=table)
        wait_count(bootstrap, source.topic, first + second)
        result = CrashResult(audit.AuditReport("outbox", ""), source, worker.names,
                             exactly_once, first, second, start_s, 0.0)
        result.stored_before_kill = connect.stored_offsets(bootstrap, worker.names, source.name)
        result.rest_before_kill = worker.rest.offsets(source.name)
        result.slot_before_kill = source.slot_state()
        result.open_before_kill = connect.transactions(bootstrap, worker.names, source.name,
                                                       ("Ongoing",))
        killed = time.monotonic()
        worker.kill()
        result.open_after_kill = connect.transactions(bootstrap, worker.names, source.name,
                                                      ("Ongoing",))
        worker.start()
        result.restart_s = round(time.monotonic() - killed, 1)
        worker.rest.wait_running(source.name)
        # Debezium re-sends what came after its stored position; then it has caught up
        after = wait_count(bootstrap, source.topic, first + 2 * second, timeout_s=30)
        result.resent = after - first - second
        # A clean stop: the task commits its open transaction (or writes its offsets) before
        # the JVM exits. (A stopped *connector*'s status says STOPPED before that is done.)
        worker.stop()
        result.stored_after = connect.stored_offsets(bootstrap, worker.names, source.name)
        result.resume_lines = worker.log_lines("WAL") + worker.log_lines("no previous LSN")
        result.committed = topics.read(bootstrap, source.topic)
        result.report = audit.audit_topic(
            bootstrap, source.topic, records, "outbox-debezium",
            "exactly_once" if exactly_once else "at_least_once", crash_at="connect-worker-killed")
        return result
    finally:
        worker.kill()  # its data is thrown away: no graceful stop needed
        source.drop()
        with pg_connect(dsn) as db:
            db.execute(f"DROP TABLE IF EXISTS {table}, {payments}")
        topics.delete(bootstrap, source.topic, worker.names.configs, worker.names.offsets,
                      worker.names.statuses)
