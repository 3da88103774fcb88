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

This module prepares a run (its topics, its names, a fault proxy) and cleans up after it.
The contract with the app is in ``labkit.torture.contract``, the supervision (kills,
restarts, stalls) in ``labkit.torture.supervise``, the result in ``labkit.torture.result``,
and the apps the lab brings (Kafka's copier, Kafka Streams, quixstreams) in
``labkit.torture.apps``.
"""
from __future__ import annotations

import re
import shlex
import time
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from labkit.checking.audit import AuditReport
from labkit.faults.faultspec import parse_fault_spec
from labkit.faults.proxy import FaultProxy
from labkit.kafka import cluster as lab
from labkit.kafka import connection, topics
from labkit.kafka import names as namespace
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import LocalCluster
from labkit.paths import lab_home
from labkit.pipelines import data
from labkit.progress import status
from labkit.torture.contract import (CHECKS, ENV_GROUP, ENV_INPUT, ENV_OUTPUT, ENV_TRANSACTIONAL_ID,
                                     GUARANTEE, SCENARIO, HarnessError, app_environment,
                                     audit_output, checked_command)
from labkit.torture.result import TortureResult
from labkit.torture.supervise import KILL_CLOCKS, STALL_S, App, Watch, supervise

ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/[^\s:'\"=]+")  # a path in an argument, up to a space, : or quote


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
    command = checked_command(command)
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


def shown(command: Sequence[str]) -> str:
    """The command as its progress line shows it: each absolute path by its last part, so a
    notebook's stored output names no directory of this machine (the result keeps the whole
    command)."""
    return shlex.join(ABSOLUTE_PATH.sub(lambda m: Path(m.group(0)).name or m.group(0), arg)
                      for arg in command)


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
    with status(f"torture: {shown(command)}") as progress, \
            (FaultProxy(cluster.bootstrap, fault)
             if fault or (plaintext and connection.for_client(cluster.bootstrap))
             else nullcontext()) as proxy, \
            App(command, app_environment(proxy.bootstrap if proxy else cluster.bootstrap,
                                         names, run_dir), run_dir) as app, \
            Watch(cluster.bootstrap, names[ENV_INPUT], names[ENV_OUTPUT],
                  names[ENV_GROUP], history_file=run_dir / "history.jsonl") as watch:
        supervise(app, watch, cluster, result, kills=kills, broker_kills=broker_kills,
                  kill_after_s=kill_after_s, timeout_s=timeout_s, seed=seed,
                  progress=progress, started=started, kill_clock=kill_clock,
                  stall_s=stall_s)
        app.stop()
        result.fault_stats = proxy.stats() if fault else None
    result.report = audit_output(cluster.bootstrap, names[ENV_OUTPUT], inputs, check)
    result.report.fault = fault
    result.seconds = round(time.monotonic() - started, 2)
    return result
