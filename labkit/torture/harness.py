"""The torture harness: put any app in the lab, kill it at random, audit what it wrote.

Jepsen's model for software the lab did not write: the harness owns the input and reads
the output, and judges the app only by what is observable in Kafka afterwards.

    result = torture(["python", "examples/torture/exactly_once_app.py"], input=400, kills=3)
    result.verdict        # 'exactly once'
    result.to_json()      # the audit keys of `labkit scenario --json`, kills, restarts, ...

The contract with the app (docs/torture.md, "Torture any app"): the lab creates an input topic of
``input`` JSON records, each with a unique ``id`` and a ``key`` (labkit.pipelines.data.generate), and
an empty output topic, and passes their names in the environment (``ENV_*`` below). The
app reads the input and writes output records that keep the input's ``id`` (or, with
``check="counts"``, a ``count`` per ``key``). The harness runs the command in its own
process group, SIGKILLs the whole group at seeded random times and starts it again, like a
supervisor, optionally SIGKILLs and restarts the lab's broker, waits until the input is
consumed and the output is quiet, stops the app and audits the output topic. An app that
stays alive but stops making progress (no offset commit, no output, its input not consumed)
for ``stall_s`` is a finding of its own, a stall: the harness SIGKILLs and restarts it too.
"""
from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from labkit import proc, settings

from labkit.checking import audit, history

from labkit.kafka import connection, javaconfig, topics

from labkit.pipelines import data
from labkit.kafka import names as namespace
from labkit.kafka import cluster as lab
from labkit.checking.audit import AuditReport
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import LocalCluster
from labkit.faults import proxy as proxy_mod
from labkit.faults.faultspec import parse_fault_spec
from labkit.paths import lab_home
from labkit.progress import status

ENV_BOOTSTRAP, ENV_INPUT, ENV_OUTPUT = settings.BOOTSTRAP, settings.INPUT_TOPIC, settings.OUTPUT_TOPIC
ENV_GROUP, ENV_TRANSACTIONAL_ID = settings.GROUP_ID, settings.TRANSACTIONAL_ID
CHECKS = ("records", "counts")
# When a fault's seeded delay starts counting: at the app's (re)start, or at its first offset
# commit after it. "commit" puts every kill between two commits of the app, whatever its
# start took (a JVM may take seconds on a loaded machine, and a kill during its start hits
# nothing the app has processed): what it processed since that commit is in flight.
KILL_CLOCKS = ("start", "commit")
SCENARIO = "torture"
# The harness does not know what the app claims; the verdict says what it showed.
GUARANTEE = "unknown"
QUIET_S = 2.0  # output unchanged this long (and the input consumed): the app is done
# An app that never commits offsets to LABKIT_GROUP_ID cannot show it consumed the input:
# for it, output unchanged this long counts as done (longer than a JVM's restart).
IDLE_S = 10.0
OWN_CRASHES = 3  # an app that dies by itself this often is broken, not unlucky
# An app alive, its input not consumed, that neither commits offsets nor writes output this
# long is stalled: a client call blocking far past its own timeout, e.g. librdkafka's
# send_offsets_to_transaction() after a broker restart (librdkafka #5456, #5511). Waiting
# for the run's timeout would only turn a finding into a failure. Longer than an app's time
# between commits (quixstreams commits every 5 s by default), a JVM app's restart and IDLE_S.
STALL_S = 30.0
MAX_STALLS = 3  # stalled this often in one run: it stalls every time it is started
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long
LOG_TAIL_LINES = 15


class HarnessError(RuntimeError):
    """The run could not be judged (bad input, an app that does not follow the contract);
    the message says what happened and what to do."""


@dataclass
class Stall:
    """The app stayed alive without progress for ``stalled_s`` and was SIGKILLed and started
    again. ``after_s``: seconds into the run when its last progress was seen."""

    after_s: float
    stalled_s: float
    consumed: int  # the group's committed offsets on the input, then
    end: int  # the input's end offsets
    written: int  # the output's size as _Watch samples it
    attempt: int  # the start of the app that stalled (1: the first)

    def text(self) -> str:
        return f"no progress for {self.stalled_s:.0f} s after {self.after_s:.1f} s"


@dataclass
class TortureResult:
    """The audit of the output plus what the harness did to the app."""

    report: AuditReport
    command: list[str]
    seed: int
    kills: int = 0  # SIGKILLs of the app's process group
    restarts: int = 0  # starts after the first (after a kill or the app's own crash)
    broker_kills: int = 0
    seconds: float = 0.0
    run_dir: str = ""  # the app's logs (one per start) and the run's history
    restart_s: list[float] = field(default_factory=list)  # SIGKILL sent -> app running again
    notes: list[str] = field(default_factory=list)  # e.g. the app finished before every kill
    fault_stats: dict | None = None  # the fault proxy's counters (with ``fault``)
    partitions: int = 1  # of the input (and the output)
    topics: dict | None = None  # {"input", "output", "kept"}: deleted after the run unless kept
    stalls: list[Stall] = field(default_factory=list)  # each restarted (counted in restarts)

    @property
    def verdict(self) -> str:
        return self.report.verdict

    def anomalies(self) -> dict[str, dict]:
        """Checker name -> its count and examples, for the checkers that found something."""
        return {r.name: {"count": r.count, "examples": r.examples}
                for r in self.report.findings() if not r.valid}

    def to_dict(self) -> dict:
        d = self.report.to_dict()  # the keys of `labkit scenario --json`, in order
        d["anomalies"] = self.anomalies()
        return {**d, "kills": self.kills, "restarts": self.restarts,
                "broker_kills": self.broker_kills, "seconds": self.seconds,
                "command": self.command, "seed": self.seed, "run_dir": self.run_dir,
                "notes": self.notes, "fault_stats": self.fault_stats,
                "partitions": self.partitions, "topics": self.topics,
                "stalled": len(self.stalls), "stalls": [asdict(s) for s in self.stalls]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def summary(self) -> str:
        r = self.report
        lines = [f"{shlex.join(self.command)}",
                 f"  kills={self.kills} restarts={self.restarts} broker_kills={self.broker_kills} "
                 f"seconds={self.seconds}",
                 f"  produced={r.produced} delivered_unique={r.delivered_unique} lost={r.lost} "
                 f"duplicated={r.duplicated} reordered={r.reordered} "
                 f"aborted_visible={r.aborted_visible} aborted_in_log={r.aborted_in_log}"]
        if self.stalls:  # a finding beside the audit's: the verdict is the output's alone
            lines.append(f"  stalled {len(self.stalls)}× ("
                         + ", ".join(s.text() for s in self.stalls) + "; restarted)")
        for name, found in self.anomalies().items():
            lines.append(f"  {name}: {found['count']}, e.g. {found['examples']}")
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"  verdict: {self.verdict}")
        return "\n".join(lines)


def torture(command: Sequence[str], *, input: int = 200, kills: int = 3, seed: int = 0,
            broker_kills: int = 0, timeout_s: float = 120.0, check: str = "records",
            kill_after_s: tuple[float, float] = (1.0, 4.0), fault: str | None = None,
            cluster: lab.Cluster | None = None, partitions: int = 1,
            keep_topics: bool = False, kill_clock: str = "start",
            plaintext: bool = False, stall_s: float = STALL_S) -> TortureResult:
    """Run ``command`` as the pipeline under test, kill it ``kills`` times (each a seeded
    random ``kill_after_s`` after the previous fault), and audit its output.

    ``broker_kills`` SIGKILLs and restarts the lab's own broker that often, interleaved with
    the app's kills (only with a local lab cluster). ``fault`` (a labkit.faults.faultspec spec,
    e.g. "drop-ack:produce:3") puts the fault proxy between the app and the broker; the
    harness itself talks to the broker directly. ``cluster`` defaults to
    ``labkit.kafka.cluster.ensure()``. ``partitions``: of the input topic (its records spread by
    key) and of the output topic. The run's two topics are deleted afterwards (also after a
    failed run) unless ``keep_topics``. ``kill_clock="commit"`` starts each fault's delay at
    the app's first offset commit (to LABKIT_GROUP_ID) after its (re)start instead of at the
    start: with a delay shorter than the app's commit interval, every kill lands between two
    of its commits. ``plaintext``: the app takes no connection settings (it ignores
    LABKIT_KAFKA_CONFIG, like a first app written in a notebook): against a cluster that
    wants TLS or credentials the proxy, without a fault, stands between it and the cluster
    (its side plaintext, TLS and SASL upstream); on a plaintext cluster nothing changes.
    ``stall_s``: an app alive, its input not consumed, whose committed offsets and output
    have not changed for this long is stalled (``TortureResult.stalls``) and restarted like a
    killed one; the ``MAX_STALLS``-th stall in a run raises HarnessError. Judged only once
    the app has committed offsets to LABKIT_GROUP_ID (an app that never does cannot show
    that its input is not consumed).
    Raises HarnessError when the run cannot be judged.
    """
    command = _checked_command(command)
    if input < 1 or kills < 0 or broker_kills < 0 or timeout_s <= 0:
        raise HarnessError(f"need input >= 1, kills >= 0, broker kills >= 0 and a positive "
                           f"timeout (got input={input}, kills={kills}, "
                           f"broker_kills={broker_kills}, timeout={timeout_s})")
    if partitions < 1:
        raise HarnessError(f"need at least one input partition (got partitions={partitions})")
    if stall_s <= 0:
        raise HarnessError(f"need a positive stall time (got stall_s={stall_s})")
    if kill_clock not in KILL_CLOCKS:
        raise HarnessError(f"unknown kill clock {kill_clock!r}: use 'start' (delays count from "
                           "the app's start) or 'commit' (from its first offset commit after a "
                           "start)")
    if check not in CHECKS:
        raise HarnessError(f"unknown check {check!r}: use 'records' (output records keep the "
                           "input's id) or 'counts' (output records carry a count per key)")
    if fault is not None:
        try:
            parse_fault_spec(fault)
        except ValueError as exc:
            raise HarnessError(str(exc)) from None
    low, high = kill_after_s
    if not 0 < low <= high:
        raise HarnessError(f"kill_after_s must be (min, max) seconds with 0 < min <= max, "
                           f"not {kill_after_s}")
    cluster = cluster or lab.ensure()
    if broker_kills and not isinstance(cluster, LocalCluster):
        raise HarnessError("--broker-kills needs the lab's own local cluster (it SIGKILLs and "
                           f"restarts the broker process); {cluster.bootstrap} is an external "
                           "cluster (LABKIT_BOOTSTRAP). Unset LABKIT_BOOTSTRAP, or drop "
                           "--broker-kills.")
    run = uuid.uuid4().hex[:8]
    # The app gets the broker's names, in the learner's namespace (labkit.kafka.names): on a shared
    # cluster its topics, group and transactional id never meet another learner's.
    names = {ENV_INPUT: namespace.topic(f"torture-{run}-in"),
             ENV_OUTPUT: namespace.topic(f"torture-{run}-out"),
             ENV_GROUP: namespace.group(f"torture-{run}"),
             ENV_TRANSACTIONAL_ID: namespace.transactional_id(f"torture-{run}")}
    run_dir = lab_home() / "torture" / run
    run_dir.mkdir(parents=True)
    inputs = data.generate(input, seed=seed)
    made = [names[ENV_INPUT], names[ENV_OUTPUT]]
    try:
        data.load_into_topic(cluster.bootstrap, names[ENV_INPUT], inputs, partitions=partitions)
        topics.create(cluster.bootstrap, names[ENV_OUTPUT], partitions=partitions)
        result = _run(command, cluster, names, run_dir, inputs, kills=kills,
                      broker_kills=broker_kills, timeout_s=timeout_s, check=check,
                      kill_after_s=kill_after_s, fault=fault, seed=seed, kill_clock=kill_clock,
                      plaintext=plaintext, stall_s=stall_s)
    finally:
        if not keep_topics:
            # Each run makes two topics (and an app may make its own, e.g. Kafka Streams'
            # changelog): a lab (or a CI broker) tortured all day would otherwise collect
            # them. Best effort: a leftover topic only costs disk.
            topics.delete(cluster.bootstrap, *made, *_app_topics(cluster.bootstrap,
                                                                  names[ENV_GROUP]))
    result.partitions = partitions
    result.topics = {"input": made[0], "output": made[1], "kept": keep_topics}
    return result


def _app_topics(bootstrap: str, group: str) -> list[str]:
    """Topics the app made for itself, named after its group the way Kafka Streams names its
    internal ones (``<application.id>-<store>-changelog``, ``...-repartition``)."""
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap, "log_level": 0}))
    try:
        listed = admin.list_topics(timeout=5).topics
    except KafkaException:
        return []  # best effort, like the deletion itself
    return sorted(t for t in listed if t.startswith(f"{group}-")
                  and t not in (f"{group}-in", f"{group}-out"))


def _run(command: list[str], cluster: lab.Cluster, names: dict[str, str], run_dir: Path,
         inputs: list[dict], *, kills: int, broker_kills: int, timeout_s: float, check: str,
         kill_after_s: tuple[float, float], fault: str | None, seed: int,
         kill_clock: str = "start", plaintext: bool = False,
         stall_s: float = STALL_S) -> TortureResult:
    """Supervise the app over the prepared topics, stop it and audit its output."""
    result = TortureResult(report=AuditReport(SCENARIO, GUARANTEE), command=command, seed=seed,
                           run_dir=str(run_dir))
    started = time.monotonic()
    with status(f"torture: {shlex.join(command)}") as progress, \
            (proxy_mod.FaultProxy(cluster.bootstrap, fault)
             if fault or (plaintext and connection.for_client(cluster.bootstrap))
             else nullcontext()) as proxy, \
            _App(command, app_environment(proxy.bootstrap if proxy else cluster.bootstrap,
                                          names, run_dir), run_dir) as app, \
            _Watch(cluster.bootstrap, names[ENV_INPUT], names[ENV_OUTPUT],
                   names[ENV_GROUP], history_file=run_dir / "history.jsonl") as watch:
        _supervise(app, watch, cluster, result, kills=kills, broker_kills=broker_kills,
                   kill_after_s=kill_after_s, timeout_s=timeout_s, seed=seed,
                   progress=progress, started=started, kill_clock=kill_clock,
                   stall_s=stall_s)
        app.stop()
        result.fault_stats = proxy.stats() if fault else None
    result.report = _audit(cluster.bootstrap, names[ENV_OUTPUT], inputs, check)
    result.report.fault = fault
    result.seconds = round(time.monotonic() - started, 2)
    return result


def app_environment(bootstrap: str, names: dict[str, str], run_dir: Path) -> dict[str, str]:
    """The app's environment: the lab's, the run's names, the history file, ``bootstrap``,
    and the cluster's connection settings as an app reads them: ``LABKIT_KAFKA_CONFIG``
    (librdkafka names, for a Python app) and ``LABKIT_KAFKA_JAVA_CONFIG`` (the same settings
    in the Java client's names, ``labkit.kafka.javaconfig``, written to the run's directory). Neither
    when ``bootstrap`` needs none (no LABKIT_KAFKA_CONFIG, or the fault proxy's plaintext side)."""
    env = {**os.environ, **names, history.ENV_FILE: str(run_dir / "history.jsonl"),
           ENV_BOOTSTRAP: bootstrap}
    env.pop(settings.KAFKA_CONFIG, None)
    env.pop(settings.KAFKA_JAVA_CONFIG, None)
    if connection.for_client(bootstrap):
        env[settings.KAFKA_CONFIG] = str(settings.current().kafka_config.resolve())
        env[settings.KAFKA_JAVA_CONFIG] = str(javaconfig.write(run_dir / "client-java.properties",
                                                               bootstrap))
    return env


def copier_command(transaction_size: int = 10, transaction_timeout_ms: int = 3000) -> list[str]:
    """Kafka's own TransactionalMessageCopier (kafka-tools) as a torture command: a shell
    line that reads the LABKIT_* environment when it runs, so the same command works for
    every run. It copies key and value unchanged, so the input's ids survive.

    It assigns itself partition 0 of the input (the harness's default, one partition), commits
    the group's offsets inside each transaction and exits when it has copied everything.

    ``transaction_timeout_ms`` is short because a restarted copier asks for its committed
    offset *before* it calls initTransactions: while its killed predecessor's transaction
    (holding an offset commit) is open, that fetch waits, and only the broker's timeout
    aborts it (the copier's default, 60 s, would stall every restart for a minute)."""
    from labkit.kafka import jvm

    java = jvm.check_java()
    jvm.resolve("tools")
    # A classpath wildcard (expanded by java itself) keeps the command line short enough to
    # read in `ps` and in the JSON result.
    jars = str(jvm.jar_dir("tools") / "*")
    script = (f"exec {shlex.quote(java)} -Xmx256m -XX:TieredStopAtLevel=1 "
              "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn "
              f"-cp {shlex.quote(jars)} org.apache.kafka.tools.TransactionalMessageCopier "
              f'--broker-list "${ENV_BOOTSTRAP}" --input-topic "${ENV_INPUT}" --input-partition 0 '
              f'--output-topic "${ENV_OUTPUT}" --consumer-group "${ENV_GROUP}" '
              f'--transactional-id "${ENV_TRANSACTIONAL_ID}" '
              f"--transaction-size {transaction_size} "
              f"--transaction-timeout {transaction_timeout_ms}")
    return ["sh", "-c", script]


def copy_with_java(bootstrap: str, name: str, records: list[dict], transaction_size: int = 5,
                   timeout_s: float = 120) -> tuple[int, list[dict]]:
    """Kafka's Java TransactionalMessageCopier copies ``records`` from topic ``<name>-in``
    to ``<name>-out`` in transactions of ``transaction_size``, through a fault proxy that
    records every request and injects nothing. Returns the copier's exit code and the
    requests it sent (the proxy's trace), to set beside librdkafka's."""
    data.load_into_topic(bootstrap, f"{name}-in", records)
    topics.create(bootstrap, f"{name}-out")
    trace: list[dict] = []
    with proxy_mod.FaultProxy(bootstrap, trace=trace.append) as proxy:
        env = {**os.environ, ENV_BOOTSTRAP: proxy.bootstrap,
               ENV_INPUT: namespace.topic(f"{name}-in"), ENV_OUTPUT: namespace.topic(f"{name}-out"),
               ENV_GROUP: namespace.group(name), ENV_TRANSACTIONAL_ID: namespace.transactional_id(name)}
        # run() kills the copier if it outlives the timeout (sh execs java: one process)
        done = subprocess.run(copier_command(transaction_size=transaction_size), env=env,
                              timeout=timeout_s, capture_output=True, text=True)
    return done.returncode, trace


STREAMS_GUARANTEES = ("at_least_once", "exactly_once_v2")
STREAMS_APP = "StreamsRunningCount.java"


def streams_command(guarantee: str = "exactly_once_v2", *, commit_interval_ms: int = 1500,
                    work_ms: float = 5.0) -> list[str]:
    """examples/torture/StreamsRunningCount.java, a running count per key in real Kafka
    Streams (kafka-streams, fetched by `labkit setup`), as a command for
    ``torture(..., check="counts")``: Java 17's single-file launcher compiles it in memory at
    each start, so there is no build step. The app reads the LABKIT_* environment itself.

    ``guarantee`` is its processing.guarantee; ``commit_interval_ms`` the same for both (a
    kill between two commits replays what was processed since the last one);
    ``work_ms`` the processing time per record, so a run lasts long enough for the kills to
    land while it works. The defaults are those of tests/test_harness_streams.py and
    notebook 07 (with ``kill_clock="commit"``, ``kill_after_s=(0.5, 1.0)``)."""
    from labkit.kafka import jvm
    from labkit.paths import project_root

    if guarantee not in STREAMS_GUARANTEES:
        raise HarnessError(f"unknown processing.guarantee {guarantee!r}: use one of "
                           f"{', '.join(STREAMS_GUARANTEES)}")
    java = jvm.check_java()
    jvm.resolve("streams")
    return [java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            # a classpath wildcard (expanded by java itself) keeps the command readable
            "-cp", str(jvm.jar_dir("streams") / "*"),
            str(project_root() / "examples" / "torture" / STREAMS_APP),
            "--guarantee", guarantee, "--commit-interval-ms", str(commit_interval_ms),
            "--work-ms", str(work_ms)]


# quixstreams 3.28 needs confluent-kafka < 2.13 while the lab pins 2.16.1: like any user's
# app, it gets an environment of its own (the lab's pins do not move for it).
QUIX_REQUIREMENTS = ("quixstreams==3.28.1", "confluent-kafka==2.12.2")
QUIX_GUARANTEES = ("at-least-once", "exactly-once")


def app_env(name: str, requirements: Sequence[str]) -> Path:
    """The Python of a virtualenv of its own for an app under test, created once under
    .cache/apps/NAME with exactly ``requirements`` (pip) and reused while they stay the
    same (a stamp file named after their hash). Returns the environment's python."""
    import fcntl
    import hashlib

    from labkit.paths import LabkitSetupError, cache_dir

    home = cache_dir() / "apps" / f"{name}-venv"
    python = home / "bin" / "python"
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:12]
    stamp = home / f".installed-{key}"
    if stamp.exists():
        return python
    home.parent.mkdir(parents=True, exist_ok=True)
    # Two test processes (or a notebook and a test) may ask at once: one builds, one waits.
    with open(home.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists():
            return python
        steps = [[sys.executable, "-m", "venv", "--clear", str(home)],
                 [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  *requirements]]
        with status(f"{name}: creating its own environment in {home} "
                    f"({' '.join(requirements)}), once") as progress:
            for i, step in enumerate(steps, 1):
                progress(f"{name}: {'venv' if i == 1 else 'pip install ' + ' '.join(requirements)}"
                         f" ({i}/{len(steps)})")
                done = subprocess.run(step, capture_output=True, text=True)
                if done.returncode != 0:
                    raise LabkitSetupError(
                        f"creating {name}'s environment failed ({shlex.join(step)}, exit "
                        f"{done.returncode}); is PyPI reachable? Its last lines:\n"
                        + "\n".join(done.stderr.splitlines()[-10:]))
        for old in home.glob(".installed-*"):
            old.unlink()
        stamp.touch()
    return python


def quix_command(guarantee: str = "exactly-once", commit_interval_s: float | None = None
                 ) -> list[str]:
    """examples/torture/quix_app.py (a quixstreams Application) as a torture command, run by
    the Python of quixstreams' own environment (created on first use, see app_env)."""
    from labkit.paths import project_root

    if guarantee not in QUIX_GUARANTEES:
        raise HarnessError(f"unknown processing guarantee {guarantee!r}: use one of "
                           f"{', '.join(QUIX_GUARANTEES)}")
    python = app_env("quixstreams", QUIX_REQUIREMENTS)
    command = [str(python), str(project_root() / "examples" / "torture" / "quix_app.py"),
               "--guarantee", guarantee]
    if commit_interval_s is not None:
        command += ["--commit-interval", str(commit_interval_s)]
    return command


# --------------------------------------------------------------------------- the run


def _checked_command(command: Sequence[str]) -> list[str]:
    command = [str(c) for c in command or ()]
    if not command:
        raise HarnessError("no command to torture: put the app's command after `--`, e.g. "
                           "labkit torture --kills 3 -- python examples/torture/exactly_once_app.py")
    if shutil.which(command[0]) is None:
        raise HarnessError(f"command not found: {command[0]!r} (not an executable file or on "
                           "PATH); give the full path or fix PATH")
    return command


def _supervise(app: "_App", watch: "_Watch", cluster: lab.Cluster, result: TortureResult, *,
               kills: int, broker_kills: int, kill_after_s: tuple[float, float],
               timeout_s: float, seed: int, progress, started: float,
               kill_clock: str = "start", stall_s: float = STALL_S) -> None:
    """Start the app, inject the seeded faults, restart it (also when it stalls), return
    once it is done."""
    rng = random.Random(seed)
    faults = ["app"] * kills + ["broker"] * broker_kills
    rng.shuffle(faults)  # the seed decides the interleaving too

    def arm() -> tuple[float, float | None, int]:
        """The next fault's seeded delay, when it is due (None: at the app's next commit),
        and the group's committed offsets now (for kill_clock="commit")."""
        delay = rng.uniform(*kill_after_s)
        if kill_clock == "start":
            return delay, time.monotonic() + delay, 0
        watch.next_at = 0.0  # fresh: the killed app may have committed just before
        return delay, None, watch.sample()[0]

    app.start()
    delay, due, consumed_at_start = arm()
    own_crashes = 0
    quiet = _Quiet()
    moving = _Progress(started)
    while True:
        now = time.monotonic()
        if due is None:
            watch.next_at = 0.0  # waiting for the commit that starts the clock: sample now
        consumed, end, written = watch.sample()
        if due is None and consumed > consumed_at_start:
            due = now + delay
        progress(f"torture: kills {result.kills}/{kills}, broker kills "
                 f"{result.broker_kills}/{broker_kills}, input consumed {consumed}/{end}, "
                 f"output {written} records")
        if now - started > timeout_s:
            raise HarnessError(_timeout_message(timeout_s, consumed, end, written, watch, app))
        code = app.poll()
        if code is not None and code != 0:
            own_crashes += 1
            if written == 0 or own_crashes >= OWN_CRASHES:
                raise HarnessError(f"the app exited with code {code} by itself (not killed by "
                                   f"the harness; {own_crashes} time(s)) after writing "
                                   f"{written} output records. Its last lines:\n{app.tail()}")
            app.start()  # as a supervisor would: it has worked before
            result.restarts += 1
            continue
        if faults and code is None and due is not None and now >= due:
            if faults.pop(0) == "app":
                result.kills += 1
                result.restart_s.append(_kill_and_restart(app, result))
            else:
                progress(f"torture: SIGKILL the broker ({result.broker_kills + 1}/{broker_kills})")
                history.append(app.history, "broker-killed")
                cluster.kill()
                cluster.restart()
                result.broker_kills += 1
                history.append(app.history, "broker-restarted")
            delay, due, consumed_at_start = arm()
            quiet = _Quiet()
            continue
        # A new start of the app or of the broker starts the stall clock over.
        stalled_s = moving.stalled_s(consumed, end, written, (app.starts, result.broker_kills))
        if code is None and stalled_s >= stall_s:
            # The pending fault (if any) keeps its clock: the seeded schedule is unchanged.
            _restart_stalled(app, watch, result, moving, stalled_s, progress)
            quiet = _Quiet()
            continue
        if code == 0:  # the app finished by itself: no process left to fault
            if written == 0 and consumed == 0:
                raise HarnessError(f"the app exited (code 0) without consuming {watch.input} "
                                   f"or writing to {watch.output}: it must read "
                                   f"${ENV_INPUT} and write ${ENV_OUTPUT}. Its last "
                                   f"lines:\n{app.tail()}")
            if faults:
                result.notes.append(
                    f"the app finished after {result.kills} of {kills} kill(s) and "
                    f"{result.broker_kills} of {broker_kills} broker kill(s): give it more "
                    "input (--input) or kill sooner so every fault lands")
                faults.clear()
            if quiet.still(written, QUIET_S):
                return
        elif faults and due is None and consumed >= end and quiet.still(written, QUIET_S):
            # kill_clock="commit": the app was done before it committed again after a fault
            result.notes.append(
                f"the app had consumed its input after {result.kills} of {kills} kill(s) and "
                f"{result.broker_kills} of {broker_kills} broker kill(s), before it committed "
                "again: give it more input (--input) so every fault lands")
            faults.clear()
        elif not faults:
            if consumed >= end and quiet.still(written, QUIET_S):
                return
            if written and consumed == 0 and quiet.still(written, IDLE_S):
                result.notes.append(f"the input was not consumed by group {watch.group} "
                                    f"({consumed}/{end} offsets committed), but the output has "
                                    f"been quiet for {IDLE_S:.0f} s: audited as it is")
                return
        quiet.still(written, 0)
        time.sleep(0.1)


def _kill_and_restart(app: "_App", result: TortureResult) -> float:
    """SIGKILL the app's process group and start it again, as a supervisor does; returns the
    seconds from the SIGKILL to the app running again."""
    t0 = time.monotonic()
    app.kill()
    app.start()
    result.restarts += 1
    return round(time.monotonic() - t0, 4)


def _restart_stalled(app: "_App", watch: "_Watch", result: TortureResult,
                     moving: "_Progress", stalled_s: float, progress) -> None:
    """Record the stall, say so, and restart the app; the MAX_STALLS-th raises HarnessError."""
    consumed, end, written = moving.seen
    stall = Stall(after_s=round(moving.since - moving.started, 1), stalled_s=round(stalled_s, 1),
                  consumed=consumed, end=end, written=written, attempt=app.starts)
    result.stalls.append(stall)
    history.append(app.history, "stalled", attempt=app.starts, stalled_s=stall.stalled_s,
                   committed=consumed, end=end, output=written)
    if len(result.stalls) >= MAX_STALLS:
        raise HarnessError(
            f"the app stalls every time it is started: {len(result.stalls)} times in this run "
            f"it stayed alive but neither committed offsets to group {watch.group} nor wrote "
            f"to {watch.output} for {stall.stalled_s:.0f} s while its input was not consumed "
            f"(restarted after each). Last seen {stall.after_s:.1f} s into the run: "
            f"{consumed} of {end} input offsets committed, {written} output records. A client "
            "call that blocks past its timeout (e.g. librdkafka's "
            "send_offsets_to_transaction(), librdkafka #5456, #5511)? A slow app needs a longer "
            f"--stall-after. Its last lines:\n{app.tail()}")
    line = (f"torture: app stalled: no commit and no output for {stall.stalled_s:.0f} s since "
            f"t={stall.after_s:.1f} s; restarting it")
    progress(line)
    print(line, file=sys.stderr, flush=True)  # stays above the spinner (rich redirects it)
    _kill_and_restart(app, result)


def _timeout_message(timeout_s: float, consumed: int, end: int, written: int,
                     watch: "_Watch", app: "_App") -> str:
    if written == 0 and consumed == 0:
        what = (f"the input was not consumed within {timeout_s:.0f} s: the app wrote nothing "
                f"to {watch.output} and group {watch.group} committed no offsets on "
                f"{watch.input}. Does it read ${ENV_INPUT} and write ${ENV_OUTPUT} "
                f"(at ${ENV_BOOTSTRAP})?")
    elif consumed < end:
        what = (f"the input was not consumed within {timeout_s:.0f} s: group {watch.group} "
                f"committed {consumed} of {end} offsets; the output has {written} records. "
                "A slow app needs a longer --timeout; a stuck one, a look at its log")
    else:
        what = (f"the output {watch.output} did not go quiet within {timeout_s:.0f} s "
                f"({written} records so far): does the app write more than once per input?")
    return f"{what}\nThe app's last lines:\n{app.tail()}"


class _Quiet:
    """Has a number stayed the same for a while? (the output's size, sampled)"""

    def __init__(self) -> None:
        self.value: int | None = None
        self.since = time.monotonic()

    def still(self, value: int, for_s: float) -> bool:
        if value != self.value:
            self.value, self.since = value, time.monotonic()
        return time.monotonic() - self.since >= for_s


class _Progress:
    """When did the app last make progress (its committed offsets or the output changed)?

    The clock starts over at each new ``epoch`` (a start of the app, a broker restart): a
    start takes its time before the first commit. Progress is only judged while the app has
    committed something and not yet its whole input: an app that never commits cannot show
    how far it got (IDLE_S covers it), and one that has consumed everything is finishing."""

    def __init__(self, started: float) -> None:
        self.started = started  # the run's start: stalls are reported relative to it
        self.seen: tuple[int, int, int] = (0, 0, 0)  # (consumed, end, written)
        self.epoch: object = None
        self.since = time.monotonic()

    def stalled_s(self, consumed: int, end: int, written: int, epoch: object) -> float:
        """Seconds without progress so far (0 while progress cannot be judged)."""
        now = time.monotonic()
        if epoch != self.epoch or (consumed, written) != (self.seen[0], self.seen[2]):
            self.epoch, self.since = epoch, now
        self.seen = (consumed, end, written)
        return now - self.since if 0 < consumed < end else 0.0


class _Watch:
    """Progress as Kafka shows it: the group's committed offsets on the input, the input's
    end, the output's size (high watermark, open transactions included). Each change is a
    "progress" event in the run's history (``history_file``): the timeline of the app's
    commits and writes, as the broker saw them, next to the harness's kills."""

    def __init__(self, bootstrap: str, input_topic: str, output_topic: str, group: str,
                 history_file: Path | None = None):
        self.input, self.output, self.group = input_topic, output_topic, group
        self.history_file = history_file
        # Same group id as the app, but this consumer never subscribes or commits: it only
        # asks the coordinator for the committed offsets, which does not join the group.
        self.consumer = Consumer(client_config({
            "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "log_level": 0}))  # connection-refused noise while a broker restarts
        self.in_parts = [TopicPartition(input_topic, p)
                         for p in topics.partitions_of(bootstrap, input_topic)]
        self.out_parts = [TopicPartition(output_topic, p)
                          for p in topics.partitions_of(bootstrap, output_topic)]
        self.last = (0, sum(self._end(tp) for tp in self.in_parts), 0)
        self.next_at = 0.0

    def _end(self, tp: TopicPartition) -> int:
        return self.consumer.get_watermark_offsets(tp, timeout=2, cached=False)[1]

    def sample(self) -> tuple[int, int, int]:
        """(offsets committed, input end, output records); at most twice a second, and the
        last answer while the broker cannot say (it may be restarting)."""
        if time.monotonic() < self.next_at:
            return self.last
        self.next_at = time.monotonic() + 0.5
        try:
            committed = sum(max(tp.offset, 0) for tp in
                            self.consumer.committed(self.in_parts, timeout=2))
            now = (committed, self.last[1], sum(self._end(tp) for tp in self.out_parts))
        except Exception:  # KafkaException / timeouts during a broker restart
            return self.last
        if now != self.last and self.history_file is not None:
            history.append(self.history_file, "progress", committed=now[0], end=now[1],
                           output=now[2])
        self.last = now
        return self.last

    def __enter__(self) -> "_Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.consumer.close()


class _App:
    """The command under test: one process group per start, its output in a log file per
    start. Every path out of the harness (done, error, Ctrl-C) kills the whole group."""

    def __init__(self, command: list[str], env: dict[str, str], run_dir: Path):
        self.command, self.env, self.run_dir = command, env, run_dir
        self.history = run_dir / "history.jsonl"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = self.run_dir / f"app-{self.starts}.log"
        with open(log, "wb") as out:
            try:
                # A session of its own: SIGKILL reaches every process the command started
                # (a shell's java, a script's workers), not only the first one.
                self.proc = proc.spawn(self.command, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=self.env, group=True)
            except OSError as exc:
                raise HarnessError(f"cannot start {self.command[0]!r}: {exc}") from None
        history.append(self.history, "started", attempt=self.starts, pid=self.proc.pid)

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        """SIGKILL the whole process group: nothing is flushed, closed or committed."""
        proc.kill([self.proc], group=True)
        history.append(self.history, "killed", attempt=self.starts)

    def stop(self) -> None:
        """SIGTERM the group (a chance to close cleanly), SIGKILL whatever is left."""
        if self.proc is None:
            return
        # The group's other members get the SIGKILL in any case (a shell's java, workers).
        proc.stop([self.proc], STOP_GRACE_S, group=True)
        history.append(self.history, "stopped", attempt=self.starts, code=self.proc.returncode)
        self.proc = None

    def tail(self) -> str:
        log = self.run_dir / f"app-{self.starts}.log"
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:] if log.exists() else []
        return "\n".join(f"  | {line}" for line in lines) or "  | (no output)"

    def __enter__(self) -> "_App":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------- the audit


def _audit(bootstrap: str, output: str, inputs: list[dict], check: str) -> AuditReport:
    """The existing checkers on the output topic, after checking it follows the contract."""
    try:
        records = topics.read(bootstrap, output, isolation="read_committed")
    except ValueError as exc:  # json.JSONDecodeError: a value that is not JSON
        raise HarnessError(f"output records must be JSON objects (the input's, with its id "
                           f"kept); reading {output} failed: {exc}") from None
    field_name = "id" if check == "records" else "count"
    for r in records:
        if not isinstance(r.value, dict) or field_name not in r.value:
            raise HarnessError(
                f"output records must be JSON objects with {field_name!r} "
                + ("(the input record's id, kept)" if check == "records" else
                   "(the count so far for the record's key)")
                + f"; this one (partition {r.partition}, offset {r.offset}, key {r.key!r}) "
                f"has none: {json.dumps(r.value)[:300]}")
    if check == "records":
        return audit.audit_topic(bootstrap, output, inputs, SCENARIO, GUARANTEE)
    report = audit.check_counts(SCENARIO, GUARANTEE, len(inputs), audit.expected_counts(inputs),
                                audit.last_value_per_key(records, "count"))
    everything = topics.read(bootstrap, output, isolation="read_uncommitted")
    report.aborted_in_log = len(everything) - len(records)
    return report


def _behind_proxy(command: list[str]) -> int:
    """Run ``command`` (Kafka's copier) through the lab's proxy and return its exit code.

    The copier has no option for client properties, so against a cluster that wants TLS or
    credentials it talks to a proxy without a fault: plaintext on 127.0.0.1, TLS and SASL
    upstream (``labkit.faults.proxy``). The proxy lives in this process, which the harness
    kills with the copier (the whole process group)."""
    with proxy_mod.FaultProxy(settings.current().bootstrap) as proxy:
        env = {**os.environ, ENV_BOOTSTRAP: proxy.bootstrap}
        child = proc.spawn(command, env=env)
        signal.signal(signal.SIGTERM, lambda *_: child.terminate())  # the harness's stop()
        return child.wait()


if __name__ == "__main__":
    # `python -m labkit.torture.harness copier` / `... streams GUARANTEE`: an app the lab did not
    # write as a command line for `labkit torture` (exec, so the harness's SIGKILL hits the
    # JVM itself, not a Python parent).
    if sys.argv[1:] == ["copier"]:
        cmd = copier_command()
        if connection.for_client(settings.current().bootstrap):
            sys.exit(_behind_proxy(cmd))
    elif len(sys.argv) == 3 and sys.argv[1] == "streams" and sys.argv[2] in STREAMS_GUARANTEES:
        cmd = streams_command(sys.argv[2])
    else:
        sys.exit("usage: python -m labkit.torture.harness copier   (Kafka's TransactionalMessageCopier)\n"
                 f"       python -m labkit.torture.harness streams {'|'.join(STREAMS_GUARANTEES)}   "
                 "(a Kafka Streams running count, for --check counts)\n"
                 "both configured from the LABKIT_* environment that `labkit torture` sets")
    os.execvp(cmd[0], cmd)
