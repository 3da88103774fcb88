"""What an exactly-once crash costs Kafka Streams: the restore of its state after a SIGKILL,
with and without KIP-892's transactional state stores (Kafka Streams 4.4,
``enable.transactional.statestores``, default false).

    run = experiments.run("streams-restore", transactional_stores=False)
    run.restored_records     # records the restarted instance read back from the changelog
    run.resume_s             # seconds from its restart to its first record processed
    run.report.state_matches # the final counts against a recount of the input

The client is the lab's real Kafka Streams running count (examples/torture/StreamsRunningCount.java,
kafka-streams 4.4.0) under ``processing.guarantee=exactly_once_v2`` with a persistent state
directory, run as a supervised command (``labkit.experiments.parts.Workers`` with a command:
one process group per start, restarted when killed). It counts ``records`` input records;
once half of them are committed (the group's offsets) and a transaction is open again, the
client reports ``mid-transaction`` and the nemesis SIGKILLs its JVM (``Kill``), which the
pool starts again on the same state directory. The app prints each store partition's
restore (a StateRestoreListener) and its first record processed as ``LABKIT {json}`` lines,
which the pool reads as the app's events; the lab waits until the input is consumed and the
output quiet, stops the app, and the checker audits the last count per key (``CountsAudit``).

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

import time

from confluent_kafka import Consumer, TopicPartition

from labkit import progress, settings
from labkit.checking import history, reads
from labkit.checking.checks import CountsAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workers, Workload
from labkit.faults.background import Background
from labkit.experiments.registry import Experiment, Option, register
from labkit.faults.nemesis import Nemesis, on
from labkit.faults.process_faults import Kill
from labkit.kafka import connection, javaconfig, jvm
from labkit.kafka.clientlog import client_config
from labkit.pipelines import data
from labkit.pipelines.common import committed_offsets

SCENARIO = "streams-restore"
STORE = "running-count"  # the app's store: its changelog is <application.id>-running-count-changelog
COMMIT_INTERVAL_MS = 1000
WORK_MS = 4.0  # per record: 1,000 records last ~4 s, long enough to kill one in the middle
KILL_AFTER_COMMIT_S = 0.4  # after the commit that passes half the input: a transaction open
START_S = 90.0  # a JVM's start, its compile of the app and its first commit, on a busy machine
QUIET_S = 2.0  # output unchanged this long, the input consumed: done


def keys_of(key_bytes: int) -> tuple[str, ...]:
    """The lab's eight account keys, each padded to ``key_bytes`` (0: as they are). Long keys
    make every count's write to the store long, so RocksDB flushes its memtable (16 MiB in
    Kafka Streams) to disk while the app runs: only then does the store hold anything a
    SIGKILL does not take (Kafka Streams turns RocksDB's write-ahead log off)."""
    return tuple(k if len(k) >= key_bytes else k + "-" + "x" * (key_bytes - len(k) - 1)
                 for k in data.DEFAULT_KEYS)


def _command(run) -> list[str]:
    args = ["--guarantee", "exactly_once_v2", "--commit-interval-ms", str(COMMIT_INTERVAL_MS),
            "--work-ms", str(WORK_MS), "--state-dir", str(run.workdir / "state")]
    return jvm.streams_app(*args, *(["--transactional-stores"] if run.o.transactional_stores
                                    else []))


def _environment(run) -> dict[str, str | None]:
    """The app's settings, as its environment (None: not in it)."""
    java_config = str(javaconfig.write(run.workdir / "client-java.properties",
                                       run.client_bootstrap)) \
        if connection.for_client(run.client_bootstrap) else None
    return {settings.BOOTSTRAP: run.client_bootstrap, settings.INPUT_TOPIC: run.topics["input"],
            settings.OUTPUT_TOPIC: run.topics["output"], settings.GROUP_ID: run.group_id,
            settings.KAFKA_JAVA_CONFIG: java_config}


RESTARTED = 2  # the app's start after the kill
AT_KILL = "committed-at-kill"  # the history's entry of the input offsets committed at the kill


def crash_and_restart(run, app: Background) -> None:
    """The client's order of things, while the pool supervises the app: killed half way
    (the nemesis, on ``mid-transaction``) and started again, until its input is consumed."""
    source, output, records = run.topics["input"], run.topics["output"], len(run.inputs)
    run.topics["changelog"] = f"{run.group_id}-{STORE}-changelog"  # the app makes it
    run.owns(run.topics["changelog"])
    consumer = Consumer(client_config({"bootstrap.servers": run.bootstrap,
                                       "group.id": run.group_id, "enable.auto.commit": False}))
    try:
        run.step(f"{records} records in {source}; the Streams app starts (exactly_once_v2, "
                 f"enable.transactional.statestores={str(run.o.transactional_stores).lower()})")
        half = records // 2
        app.wait_for(lambda: _committed(consumer, source) >= half,
                     f"the app to commit {half} input offsets", START_S)
        committed_at_commit = _committed(consumer, source)
        time.sleep(KILL_AFTER_COMMIT_S)
        run.event("mid-transaction")  # SIGKILL; the pool starts it on the same state directory
        committed_at_kill = _committed(consumer, source)
        run.observe(committed_at_kill=committed_at_kill)
        # in the history too: the audit names its fault from it (a stored run's alike)
        history.append(run.history_file, reads.KEPT, role=AT_KILL, value=committed_at_kill)
        run.step(f"killed with {committed_at_kill}/{records} input offsets committed "
                 f"({committed_at_commit} {KILL_AFTER_COMMIT_S} s before), a transaction open; "
                 "the app starts again on the same state directory")
        if committed_at_kill >= records:
            raise RuntimeError(f"the app had committed all {records} records before it was "
                               "killed: give it more records (--records) or more work per record")
        app.wait_for(lambda: any(e["event"] == "first-record"
                                 for e in app.pool.app_events(0, RESTARTED)),
                     "the restarted app to process a record", START_S)
        run.step("the restarted app processes records again")
        _wait_done(app, consumer, source, output)
        run.step("input consumed, output quiet: the app is stopped (SIGTERM)")
    finally:  # the app itself is stopped when this returns, or fails (Workers)
        consumer.close()


def _facts(run) -> dict:
    events = run.workers.app_events(0, RESTARTED)  # the restarted instance's
    restores = [e for e in events if e["event"] == "restore-end"]
    at = {e["event"]: e["at_ms"] for e in reversed(events)}  # each event's first time
    started = next(e["t"] for e in history.read(run.history_file)  # the wall clock, as at_ms
                   if e["kind"] == "started" and e["attempt"] == RESTARTED)
    return dict(
        transactional_stores=run.o.transactional_stores, records=len(run.inputs),
        restored_records=sum(e["restored"] for e in restores),
        restore_ms=sum(e["ms"] for e in restores),
        resume_s=round(at["first-record"] / 1000 - started, 2),
        running_s=round(at.get("running", 0) / 1000 - started, 2),
        restores=restores, run_dir=str(run.workdir), seconds=run.elapsed())


def _committed(consumer: Consumer, topic: str) -> int:
    """The input offsets the app's group has committed (this consumer never joins it). On a
    broker just started the group's coordinator may still be loading: asked again then."""
    return max(committed_offsets(consumer, topic, [0])[0], 0)


def _end_offset(consumer: Consumer, topic: str) -> int:
    return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1]


def _wait_done(app: Background, consumer: Consumer, source: str, output: str) -> None:
    """Until the input is committed to its end and the output has not grown for QUIET_S."""
    end = _end_offset(consumer, source)
    seen = {"size": -1, "since": time.monotonic()}

    def done() -> bool:
        size = _end_offset(consumer, output)
        if size != seen["size"]:
            seen.update(size=size, since=time.monotonic())
            progress.beat()
        return (_committed(consumer, source) >= end
                and time.monotonic() - seen["since"] >= QUIET_S)

    app.wait_for(done, f"the app to consume {end} records and its output to go quiet", START_S)


def _fault(run) -> str:
    """The kill as the audit names it, from the run's history (what the clients kept)."""
    (at_kill,) = [e["value"] for e in reads.events(run)
                  if e.get("kind") == reads.KEPT and e.get("role") == AT_KILL]
    return f"SIGKILL at {at_kill}/{len(run.inputs)} committed"


def _summary(run) -> str:
    return (f"{run.report.summary()}\nenable.transactional.statestores="
            f"{str(run.transactional_stores).lower()}: killed at {run.committed_at_kill}/"
            f"{run.records} committed; restored {run.restored_records} records from the "
            f"changelog in {run.restore_ms} ms; processing resumed {run.resume_s:.1f} s "
            "after the restart")


register(Experiment(
    SCENARIO, "Kafka Streams (exactly_once_v2) SIGKILLed half way and restarted: its restore "
    "from the changelog, with or without transactional state stores (KIP-892)",
    options=(Option("transactional_stores", False, "enable.transactional.statestores (KIP-892)",
                    kind=bool),
             common.records(1000, minimum=100, why="the kill lands half way"),
             Option("key_bytes", 0, "pad each key to this many bytes (16384: a state RocksDB "
                    "flushes to disk while the app runs)", kind=int)),
    workload=lambda o: Workload(SCENARIO, (Topic("input", loaded=True), Topic("output")),
                                data.generate(o.records, seed=0, keys=keys_of(o.key_bytes))),
    clients=lambda run: Workers(None, [_environment(run)], label="the Streams app",
                                command=_command(run), script=crash_and_restart),
    nemesis=lambda o: Nemesis(Kill(0, on("mid-transaction"), name="SIGKILL the app's JVM")),
    checkers=lambda o: [CountsAudit(SCENARIO, "exactly_once", fault=_fault)],
    facts=_facts,
    presentation=Presentation(summary=_summary, json_facts=(
        "transactional_stores", "records", "committed_at_kill", "restored_records",
        "restore_ms", "resume_s", "running_s", "seconds", "restores", "run_dir")),
    text=lambda run: f"{run.summary()}\n{run.timeline()}"))
