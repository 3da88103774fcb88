"""A real Kafka Connect worker (distributed mode) as a child JVM, on the lab's cluster.

    with ConnectWorker(bootstrap, exactly_once=True) as worker:   # start, wait ready, stop
        worker.rest.create("outbox", config)          # labkit.kafka.connectrest: REST calls
        worker.kill()                                 # SIGKILL: no offsets flushed, no commit
        worker.restart()                              # same group and topics: resumes

The worker is Kafka's own ``org.apache.kafka.connect.cli.ConnectDistributed`` from
``connect-runtime`` of the broker's Kafka version (``jvm.classpath("connect")``), with the
plugins of ``jvm.CONNECT_PLUGINS`` (Debezium) on its ``plugin.path``. Its configs, offsets
and statuses live in three topics on the cluster (``WorkerNames``: in the learner's
namespace), so a restarted worker finds its connectors and where they stopped. REST listens
on 127.0.0.1 at a free port.

``exactly_once`` sets the worker's ``exactly.once.source.support=enabled`` (KIP-618): every
source task writes its records *and its offsets* in one producer transaction. Without it
(Kafka's default) records are sent as they come and offsets are written apart, every
``commit_interval_ms`` (``offset.flush.interval.ms``): what was sent after the last write is
sent again after a crash. An exactly-once connector with ``transaction.boundary=interval``
commits its transactions at the same interval.
"""
from __future__ import annotations

import atexit
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from labkit import proc, settings

from labkit.kafka import connection, javaconfig, jvm, names, topics
from labkit.kafka.brokerconfig import LOG4J2
from labkit.kafka.connectrest import ConnectError, ConnectRest
from labkit.kafka.inspect import Inspector, Transaction
from labkit.kafka.ports import free_port
from labkit.paths import lab_home
from labkit.progress import status

MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"  # in every worker JVM's command line
HOST = "127.0.0.1"
# Measured 2 s on a quiet 2-core machine (5 s loaded), ~6 s after a SIGKILL (the dead
# worker's session expires first); the first start also fetches the jars.
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
# Kafka's default: offsets written once a minute. A lesson's window between "sent" and
# "offsets written" is this long; a crash inside it sends those records again.
DEFAULT_COMMIT_INTERVAL_MS = 60_000
# A dead worker leaves its group after this (the broker's group.min.session.timeout.ms is
# 6 s): a restarted worker gets the connector back that much after the kill, not 10 s later.
SESSION_TIMEOUT_MS = 6000


@dataclass(frozen=True)
class WorkerNames:
    """The broker's names for one Connect cluster: its group and its three topics. A task's
    transactional id is ``<group>-<connector>-<task>``; an exactly-once cluster's leader
    writes the config topic as ``connect-cluster-<group>`` (Kafka's naming: not prefixed by
    the namespace, so a room's ACLs must grant that id apart)."""

    group: str
    configs: str
    offsets: str
    statuses: str

    @classmethod
    def of(cls, name: str) -> "WorkerNames":
        return cls(names.group(name), names.topic(f"{name}-configs"),
                   names.topic(f"{name}-offsets"), names.topic(f"{name}-status"))

    def task_transactional_id(self, connector: str, task: int = 0) -> str:
        return f"{self.group}-{connector}-{task}"

    @property
    def leader_transactional_id(self) -> str:
        return f"connect-cluster-{self.group}"


def worker_properties(bootstrap: str, worker: WorkerNames, port: int, *, exactly_once: bool,
                      commit_interval_ms: int, extra: dict[str, object] | None = None
                      ) -> dict[str, str]:
    """connect-distributed.properties for one worker of ``worker``'s cluster."""
    props: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": worker.group,
        "config.storage.topic": worker.configs,
        "offset.storage.topic": worker.offsets,
        "status.storage.topic": worker.statuses,
        # -1: the cluster's default.replication.factor (1 on the lab's broker, 3 on a room's)
        "config.storage.replication.factor": -1,
        "offset.storage.replication.factor": -1,
        "status.storage.replication.factor": -1,
        # Lab-sized (Kafka: 25 and 5): one partition reads as one list of offsets records.
        "offset.storage.partitions": 1,
        "status.storage.partitions": 1,
        # The records are the outbox's payloads (JSON text) and its keys, as they were written.
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "listeners": f"http://{HOST}:{port}",
        "rest.advertised.host.name": HOST,
        "rest.advertised.port": port,
        "plugin.path": str(jvm.plugin_path()),
        # Plugins found from their META-INF/services manifests (Debezium ships them) instead
        # of scanning every class of every jar (KIP-898).
        "plugin.discovery": "service_load",
        "offset.flush.interval.ms": commit_interval_ms,
        "exactly.once.source.support": "enabled" if exactly_once else "disabled",
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": 1000,
        # A worker that left is not waited for (Kafka: 5 min) before its connectors move:
        # the restarted worker, a new member, gets them at once.
        "scheduled.rebalance.max.delay.ms": 0,
        "task.shutdown.graceful.timeout.ms": 5000,
    }
    # LABKIT_KAFKA_CONFIG for the worker's own clients and, prefixed, for its tasks'.
    for key, value in javaconfig.for_client(bootstrap).items():
        for prefix in ("", "producer.", "consumer.", "admin."):
            props[prefix + key] = value
    props.update(extra or {})
    return {k: str(v) for k, v in props.items()}


def _escaped(value: str) -> str:
    # java.util.Properties reads backslashes as escapes and a line end as the value's end.
    return value.replace("\\", "\\\\").replace("\n", "\\n")


class ConnectWorker:
    """One Connect worker JVM of the Connect cluster ``name`` (its group and topics).

    ``exactly_once``: KIP-618's exactly-once source support on this worker (every source
    task transactional). ``commit_interval_ms``: ``offset.flush.interval.ms``. ``properties``:
    more worker settings (they win)."""

    def __init__(self, bootstrap: str, name: str = "connect", *, exactly_once: bool = False,
                 commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
                 home: Path | str | None = None, port: int | None = None,
                 properties: dict[str, object] | None = None):
        self.bootstrap = bootstrap
        self.names = WorkerNames.of(name)
        self.exactly_once = exactly_once
        self.commit_interval_ms = commit_interval_ms
        self.dir = Path(home) if home else lab_home() / "connect" / name
        self.port = port or free_port()
        self.extra = dict(properties or {})
        self._child: subprocess.Popen | None = None
        self._owner = os.getpid()
        self._at_exit = False
        self._spawned = 0.0
        self.starts: list[float] = []  # seconds from spawn to ready, one per start

    # -- where ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def rest(self) -> ConnectRest:
        return ConnectRest(self.url)

    @property
    def log_file(self) -> Path:
        return self.dir / "connect.log"

    @property
    def out_file(self) -> Path:
        return self.dir / "connect.out"

    @property
    def alive(self) -> bool:
        return self._child is not None and self._child.poll() is None

    @property
    def pid(self) -> int | None:
        return self._child.pid if self.alive else None

    @property
    def startup_s(self) -> float | None:
        """Seconds the last start took, from spawning the JVM to a ready worker."""
        return self.starts[-1] if self.starts else None

    def properties(self) -> dict[str, str]:
        return worker_properties(self.bootstrap, self.names, self.port,
                                 exactly_once=self.exactly_once,
                                 commit_interval_ms=self.commit_interval_ms, extra=self.extra)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self, wait: bool = True) -> "ConnectWorker":
        """Start the worker and wait until it serves REST as a member of its group
        (``wait=False``: only start its JVM; ``ready()`` waits, meanwhile the caller can do
        something else)."""
        if self.alive:
            return self
        java = jvm.check_java()
        classpath = jvm.classpath("connect")
        for plugin in jvm.CONNECT_PLUGINS:
            jvm.resolve(plugin)
        self.dir.mkdir(parents=True, exist_ok=True)
        connection.write_properties(  # owner-only: it may hold LABKIT_KAFKA_CONFIG's password
            self.dir / "worker.properties",
            {k: _escaped(v) for k, v in self.properties().items()},
            header=f"Kafka Connect worker of {self.names.group}, written by labkit.kafka.connect")
        (self.dir / "log4j2.properties").write_text(LOG4J2.format(log=self.log_file))
        cmd = [java, "-Xmx512m", "-Xms64m", *settings.SHORT_LIVED_JVM.split(),
               "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
               # log4j's own shutdown hook would stop the log as the worker starts stopping,
               # hiding how its tasks stopped (their last commit); lines are flushed as written
               "-Dlog4j2.shutdownHookEnabled=false",
               f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
               "-cp", classpath, MAIN, str(self.dir / "worker.properties")]
        self._spawned = time.monotonic()
        with open(self.out_file, "ab") as out:
            self._child = proc.spawn(cmd, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, group=True)
        if not self._at_exit:  # a worker started from a thread does not die with its owner
            atexit.register(self._kill_at_exit)
            self._at_exit = True
        return self.ready() if wait else self

    def ready(self) -> "ConnectWorker":
        """Wait until the worker just started is ready (``start(wait=False)``)."""
        try:
            self.wait_ready(self._spawned)
        except BaseException:  # a failed start, Ctrl-C: no JVM left behind
            self.kill()
            raise
        self.starts.append(round(time.monotonic() - self._spawned, 1))
        return self

    def _kill_at_exit(self) -> None:
        if os.getpid() == self._owner:  # not in a forked child that inherited atexit
            self.kill()

    def wait_ready(self, started: float | None = None, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until REST's /health says the worker has joined its group and read its topics."""
        started = time.monotonic() if started is None else started
        mode = "exactly-once" if self.exactly_once else "at-least-once"
        title = f"Starting a Kafka Connect worker ({mode} sources) on {self.url}"
        with status(title) as update:
            while True:
                if not self.alive:
                    raise ConnectError(
                        f"the Connect worker exited (code {self._child.returncode if self._child else '?'}) "
                        f"before it was ready; see {self.log_file}{self.last_errors()}")
                if self.rest.healthy():
                    return
                waited = time.monotonic() - started
                if waited > timeout_s:
                    raise ConnectError(f"the Connect worker was not ready within {timeout_s:.0f} s; "
                                       f"see {self.log_file}{self.last_errors()}")
                update(f"{title}: {waited:.0f} s")
                time.sleep(0.25)

    def kill(self) -> None:
        """SIGKILL the worker: no task is stopped, no offset written, no transaction ended."""
        if self._child is not None:
            proc.kill([self._child], group=True)
            self._child = None

    def restart(self) -> "ConnectWorker":
        """SIGKILL it if it runs, then start it again: same group, topics and port."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        """SIGTERM (Connect stops its tasks, which write their last offsets or commit their
        last transaction on the way out), SIGKILL after STOP_TIMEOUT_S."""
        if self._child is not None:
            proc.stop([self._child], STOP_TIMEOUT_S, group=True)
            self._child = None

    def __enter__(self) -> "ConnectWorker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what it says ----------------------------------------------------------------------
    def last_errors(self, lines: int = 3) -> str:
        found: list[str] = []
        for log in (self.log_file, self.out_file):
            try:
                found += [line.strip() for line in log.read_text(errors="replace").splitlines()
                          if " ERROR " in line or "Exception" in line]
            except OSError:
                continue
        return ("; its last errors:\n  " + "\n  ".join(found[-lines:])) if found else ""

    def log_lines(self, containing: str) -> list[str]:
        """The worker's log lines (all its starts) that contain ``containing``."""
        try:
            return [line for line in self.log_file.read_text(errors="replace").splitlines()
                    if containing in line]
        except OSError:
            return []


def workers_left(under: Path | str | None = None) -> list[str]:
    """Command lines of the Connect worker JVMs still running (whose directory is ``under``
    that path, if given): what a test checks after its last worker stopped."""
    return [cmd for p in proc.find(MAIN)
            if (cmd := proc.command_line(p)) and (under is None or str(under) in cmd)]


# --------------------------------------------------------------------------- what it keeps

@dataclass(frozen=True)
class StoredOffset:
    """One record of a Connect cluster's offsets topic: a source partition's position as a
    task wrote it (``offset`` None: a tombstone, the position was reset)."""

    offset_in_topic: int          # where this record sits in the offsets topic
    connector: str
    partition: dict               # the source's partition, e.g. {"server": "outbox-1"}
    offset: dict | None           # the source's position, e.g. Debezium's {"lsn": ...}
    committed: bool               # False: written in a transaction that was not committed


def stored_offsets(bootstrap: str, worker: WorkerNames, connector: str | None = None
                   ) -> list[StoredOffset]:
    """The offsets topic's records (of ``connector``), in the order the tasks wrote them,
    read_uncommitted, each marked with whether a read_committed reader sees it: an
    exactly-once task writes its offsets in the transaction of its records."""
    everything = topics.read(bootstrap, worker.offsets, isolation="read_uncommitted")
    committed = {(r.partition, r.offset)
                 for r in topics.read(bootstrap, worker.offsets, isolation="read_committed")}
    out = []
    for r in everything:
        name, partition = json.loads(r.key) if r.key else (None, None)
        if connector is None or name == connector:
            out.append(StoredOffset(r.offset, name, partition, r.value,
                                    (r.partition, r.offset) in committed))
    return out


def transactions(bootstrap: str, worker: WorkerNames, connector: str | None = None,
                 states: tuple[str, ...] = ()) -> list[Transaction]:
    """The transactions the broker knows of this Connect cluster's producers (the lab's
    inspector: ListTransactions and DescribeTransactions): each exactly-once task's
    (``<group>-<connector>-<task>``) and the leader's (``connect-cluster-<group>``, which
    writes the config topic). ``states``: only those (e.g. ``("Ongoing",)``); default any."""
    prefix = f"{worker.group}-{connector}-" if connector else f"{worker.group}-"
    with Inspector(bootstrap) as inspector:
        ids = [t for t in inspector.transactional_ids(states)
               if t.startswith(prefix) or (connector is None and t == worker.leader_transactional_id)]
        return [t for t in inspector.describe_transactions(ids)
                if not states or t.state in states]
