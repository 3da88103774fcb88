"""What an exactly-once crash costs Kafka Streams: the restore of its state after a SIGKILL,
with and without KIP-892's transactional state stores (Kafka Streams 4.4,
``enable.transactional.statestores``, default false).

    run = streams_restore(lab.bootstrap, transactional_stores=False)   # -> RestoreRun
    run.restored_records     # records the restarted instance read back from the changelog
    run.resume_s             # seconds from its restart to its first record processed
    run.report.state_matches # the final counts against a recount of the input

The app is the lab's real Kafka Streams running count (examples/torture/StreamsRunningCount.java,
kafka-streams 4.4.0) under ``processing.guarantee=exactly_once_v2`` with a persistent state
directory. It counts ``records`` input records; once half of them are committed (the group's
offsets) the lab SIGKILLs its JVM between two commits, a transaction open, and starts it again
on the same state directory. The app prints each store partition's restore (a
StateRestoreListener) and its first record processed; the lab reads those lines, waits until
the input is consumed and the output quiet, stops the app and audits the last count per key.

KIP-892's promise: without transactional stores, Kafka Streams under exactly-once wipes a
store it finds unclosed and restores it from the changelog; with them, the store keeps what
was committed. Measured on kafka-streams 4.4.0 (docs/measurements.md, "Kafka Streams restore
after an exactly-once crash (KIP-892)"): with them on, the restarted instance restores only
the changelog records written since RocksDB last flushed the store to disk (the store's
committed offset is flushed with it); Kafka Streams turns RocksDB's write-ahead log off, so
a small state that never left the memtable (the lab's eight short keys) is restored in full
in both modes. ``key_bytes`` pads the keys so the store flushes while the app runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from labkit import proc, progress, settings
from labkit.checking import audit
from labkit.checking.audit import AuditReport
from labkit.experiments.registry import Experiment, Option, RunBasics, register
from labkit.kafka import connection, javaconfig, jvm, names, topics
from labkit.kafka.clientlog import client_config
from labkit.paths import lab_home
from labkit.pipelines import data
from labkit.pipelines.common import committed_offsets
from labkit.progress import wait_until

SCENARIO = "streams-restore"
STORE = "running-count"  # the app's store: its changelog is <application.id>-running-count-changelog
COMMIT_INTERVAL_MS = 1000
WORK_MS = 4.0  # per record: 1,000 records last ~4 s, long enough to kill one in the middle
KILL_AFTER_COMMIT_S = 0.4  # after the commit that passes half the input: a transaction open
START_S = 90.0  # a JVM's start, its compile of the app and its first commit, on a busy machine
QUIET_S = 2.0  # output unchanged this long, the input consumed: done
STOP_GRACE_S = 5.0
PREFIX = "LABKIT "


@dataclass
class RestoreRun(RunBasics):
    report: AuditReport
    transactional_stores: bool
    records: int
    committed_at_kill: int  # input offsets committed when the JVM was killed
    restored_records: int  # read back from the changelog by the restarted instance
    restore_ms: int  # the restore's own time (the listener's start to end)
    resume_s: float  # the restart to the first record processed
    running_s: float  # the restart to the state RUNNING
    seconds: float  # the whole run
    restores: list[dict] = field(default_factory=list)  # the restarted app's restore events
    topics: dict[str, str] = field(default_factory=dict)
    steps: list[tuple[float, str]] = field(default_factory=list, repr=False)
    run_dir: str = ""

    def to_json(self) -> str:
        return json.dumps({**json.loads(self.report.to_json()),
                           "transactional_stores": self.transactional_stores,
                           "records": self.records, "committed_at_kill": self.committed_at_kill,
                           "restored_records": self.restored_records,
                           "restore_ms": self.restore_ms, "resume_s": self.resume_s,
                           "running_s": self.running_s, "seconds": self.seconds,
                           "restores": self.restores, "run_dir": self.run_dir})

    def summary(self) -> str:
        return (f"{self.report.summary()}\nenable.transactional.statestores="
                f"{str(self.transactional_stores).lower()}: killed at {self.committed_at_kill}/"
                f"{self.records} committed; restored {self.restored_records} records from the "
                f"changelog in {self.restore_ms} ms; processing resumed {self.resume_s:.1f} s "
                "after the restart")


class StreamsApp:
    """The running count as a process of its own (its own session, so the SIGKILL reaches the
    JVM itself), its stdout in a log per start, its "LABKIT " event lines read from it."""

    def __init__(self, command: list[str], env: dict[str, str], run_dir: Path):
        self.command, self.env, self.run_dir = command, env, run_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.started_at = 0.0  # wall clock (the app's events carry the same clock)

    @property
    def log(self) -> Path:
        return self.run_dir / f"app-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "wb") as out:
            self.started_at = time.time()
            self.proc = proc.spawn(self.command, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=self.env, group=True)

    def events(self) -> list[dict]:
        """This start's event lines so far (a line still being written is left for later)."""
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        found = []
        for line in lines:
            if line.startswith(PREFIX):
                try:
                    found.append(json.loads(line[len(PREFIX):]))
                except ValueError:
                    pass
        return found

    def alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"the Streams app exited by itself (code {self.proc.returncode}); "
                               f"its last lines:\n{tail}")
        return self.proc is not None

    def kill(self) -> None:
        """SIGKILL its process group: nothing flushed, closed or committed."""
        proc.kill([self.proc], group=True)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            proc.stop([self.proc], STOP_GRACE_S, group=True)
            self.proc = None


def _committed(consumer: Consumer, topic: str) -> int:
    """The input offsets the app's group has committed (this consumer never joins it). On a
    broker just started the group's coordinator may still be loading: asked again then."""
    return max(committed_offsets(consumer, topic, [0])[0], 0)


def _end_offset(consumer: Consumer, topic: str) -> int:
    return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1]


def keys_of(key_bytes: int) -> tuple[str, ...]:
    """The lab's eight account keys, each padded to ``key_bytes`` (0: as they are). Long keys
    make every count's write to the store long, so RocksDB flushes its memtable (16 MiB in
    Kafka Streams) to disk while the app runs: only then does the store hold anything a
    SIGKILL does not take (Kafka Streams turns RocksDB's write-ahead log off)."""
    return tuple(k if len(k) >= key_bytes else k + "-" + "x" * (key_bytes - len(k) - 1)
                 for k in data.DEFAULT_KEYS)


def streams_restore(bootstrap: str, *, transactional_stores: bool, records: int = 1000,
                    key_bytes: int = 0, seed: int = 0, work_ms: float = WORK_MS,
                    commit_interval_ms: int = COMMIT_INTERVAL_MS) -> RestoreRun:
    """Count ``records`` in real Kafka Streams (exactly_once_v2), SIGKILL it half way,
    restart it on the same state directory, measure its restore and audit the counts.
    ``key_bytes``: the keys' length (``keys_of``)."""
    run = uuid.uuid4().hex[:8]
    app_id = names.group(f"streams-restore-{run}")
    source, output = names.topic(f"streams-restore-{run}-in"), names.topic(f"streams-restore-{run}-out")
    run_dir = lab_home() / "streams-restore" / run
    run_dir.mkdir(parents=True)
    inputs = data.generate(records, seed=seed, keys=keys_of(key_bytes))
    args = ["--guarantee", "exactly_once_v2", "--commit-interval-ms", str(commit_interval_ms),
            "--work-ms", str(work_ms), "--state-dir", str(run_dir / "state")]
    command = jvm.streams_app(*args, *(["--transactional-stores"] if transactional_stores else []))
    env = {**os.environ, settings.BOOTSTRAP: bootstrap, settings.INPUT_TOPIC: source,
           settings.OUTPUT_TOPIC: output, settings.GROUP_ID: app_id}
    env.pop(settings.KAFKA_JAVA_CONFIG, None)
    if connection.for_client(bootstrap):
        env[settings.KAFKA_JAVA_CONFIG] = str(javaconfig.write(run_dir / "client-java.properties",
                                                               bootstrap))
    began = time.monotonic()
    steps: list[tuple[float, str]] = []

    def step(what: str) -> None:
        steps.append((round(time.monotonic() - began, 1), what))
        progress.step(what)

    app = StreamsApp(command, env, run_dir)
    consumer = Consumer(client_config({"bootstrap.servers": bootstrap, "group.id": app_id,
                                       "enable.auto.commit": False}))
    made = {"input": source, "output": output, "changelog": f"{app_id}-{STORE}-changelog"}
    try:
        data.load_into_topic(bootstrap, source, inputs)
        topics.create(bootstrap, output)
        step(f"{records} records in {source}; the Streams app starts (exactly_once_v2, "
             f"enable.transactional.statestores={str(transactional_stores).lower()})")
        app.start()
        half = records // 2
        wait_until(lambda: app.alive() and _beat(_committed(consumer, source) >= half),
                   f"the app to commit {half} input offsets", START_S)
        committed_at_commit = _committed(consumer, source)
        time.sleep(KILL_AFTER_COMMIT_S)
        app.kill()
        committed_at_kill = _committed(consumer, source)
        step(f"SIGKILL the app's JVM, {committed_at_kill}/{records} input offsets committed "
             f"({committed_at_commit} {KILL_AFTER_COMMIT_S} s before), a transaction open")
        if committed_at_kill >= records:
            raise RuntimeError(f"the app had committed all {records} records before it was "
                               "killed: give it more records (--records) or more work per record")
        progress.check()
        app.start()
        step("the app starts again on the same state directory")
        wait_until(lambda: app.alive() and _beat(any(e["event"] == "first-record"
                                                     for e in app.events())),
                   "the restarted app to process a record", START_S)
        step("the restarted app processes records again")
        _wait_done(app, consumer, source, output)
        step("input consumed, output quiet: the app is stopped (SIGTERM)")
        app.stop()
        report = _audit(bootstrap, output, inputs)
    finally:  # also when the run fails half way: no JVM and no topic left behind
        app.stop()
        consumer.close()
        topics.delete(bootstrap, *made.values())
    report.fault = f"SIGKILL at {committed_at_kill}/{records} committed"
    events = app.events()  # the restarted instance's
    restores = [e for e in events if e["event"] == "restore-end"]
    at = {e["event"]: e["at_ms"] for e in reversed(events)}  # each event's first time
    return RestoreRun(report, transactional_stores, records, committed_at_kill,
                      restored_records=sum(e["restored"] for e in restores),
                      restore_ms=sum(e["ms"] for e in restores),
                      resume_s=round(at["first-record"] / 1000 - app.started_at, 2),
                      running_s=round(at.get("running", 0) / 1000 - app.started_at, 2),
                      seconds=round(time.monotonic() - began, 1), restores=restores,
                      topics=made, steps=steps, run_dir=str(run_dir))


def _audit(bootstrap: str, output: str, inputs: list[dict]) -> AuditReport:
    """The last count per key in the output (read_committed) against a recount of the input."""
    read = topics.read(bootstrap, output, isolation="read_committed")
    report = audit.check_counts(SCENARIO, "exactly_once", len(inputs),
                                audit.expected_counts(inputs), audit.last_value_per_key(read, "count"))
    everything = topics.read(bootstrap, output, isolation="read_uncommitted")
    report.aborted_in_log = len(everything) - len(read)
    return report


def _beat(value: bool) -> bool:
    progress.beat()
    return value


def _wait_done(app: StreamsApp, consumer: Consumer, source: str, output: str) -> None:
    """Until the input is committed to its end and the output has not grown for QUIET_S."""
    end = _end_offset(consumer, source)
    seen = {"size": -1, "since": time.monotonic()}

    def done() -> bool:
        app.alive()
        size = _end_offset(consumer, output)
        if size != seen["size"]:
            seen.update(size=size, since=time.monotonic())
            progress.beat()
        return (_committed(consumer, source) >= end
                and time.monotonic() - seen["since"] >= QUIET_S)

    wait_until(done, f"the app to consume {end} records and its output to go quiet", START_S)


def _run(context, *, transactional_stores: bool, records: int, key_bytes: int) -> RestoreRun:
    return streams_restore(context.bootstrap, transactional_stores=transactional_stores,
                           records=records, key_bytes=key_bytes)


def check_records(records: int) -> None:
    if records < 100:
        raise ValueError(f"records must be 100 or more (the kill lands half way), not {records}")


register(Experiment(
    SCENARIO, "Kafka Streams (exactly_once_v2) SIGKILLed half way and restarted: its restore "
    "from the changelog, with or without transactional state stores (KIP-892)",
    _run, check=lambda transactional_stores, records, key_bytes: check_records(records),
    text=lambda run: f"{run.summary()}\n{run.timeline()}",
    options=(Option("transactional_stores", False, "enable.transactional.statestores (KIP-892)",
                    kind=bool),
             Option("records", 1000, "how many input records (100 or more)", kind=int,
                    short="-n"),
             Option("key_bytes", 0, "pad each key to this many bytes (16384: a state RocksDB "
                    "flushes to disk while the app runs)", kind=int))))
