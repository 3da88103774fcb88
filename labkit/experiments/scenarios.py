"""Scenarios: one experiment = generate input, run a pipeline (crashing it, or behind a
network fault), audit what is observable afterwards.

    report = run("consume-transform-produce", "at_least_once", crash_at="after-process-before-commit")
    print(report.summary())       # lost=0 duplicated=10 ...

The pieces never reach into each other (Jepsen's split): ``labkit.pipelines.data`` generates, a
``labkit.pipelines`` module processes (in a child process the ``faults.runner`` crashes and
restarts), ``labkit.faults.proxy`` breaks the network, ``labkit.checking.audit`` judges.

Deterministic by construction: fixed seed, one input partition, fixed batches, and the
crash fires on the ``CRASH_HIT``-th visit of its point. ``instances`` and ``partitions``
run several members of one consumer group over a partitioned input, as applications run:
rebalances move partitions between them, and the audit must stay exact all the same.
"""
from __future__ import annotations

import inspect
import json
import shutil
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from labkit.checking import audit, history, timeline

from labkit.kafka import topics

from labkit.pipelines import data
from labkit.kafka import names as namespace
from labkit.checking.audit import AuditReport
from labkit.faults import crashpoints
from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.faults.runner import RunResult, run_workers
from labkit.paths import lab_home
from labkit.pipelines import consumer, ctp, learner, producer, running_count
from labkit.pipelines.group import GROUP_PROTOCOLS, check_group_protocol
from labkit.pipelines.guarantee import GUARANTEES
from labkit.kafka.topics import ISOLATION_LEVELS

CRASH_HIT = 2  # crash on the second batch: one batch is safely done before the crash
BATCH_SIZE = 10

AMO, ALO, EO = GUARANTEES


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    worker: Callable
    crash_points: dict[str, tuple[str, ...]]  # per guarantee: the points its code passes
    produces: bool = True  # does the pipeline write to Kafka (so produce faults apply)?
    stateful: bool = False
    reads_input: bool = True  # as a consumer-group member (the producer reads a list)
    scales: bool = True  # can several instances share the input? (see _instances)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("producer", "source records -> topic; source position in a progress topic",
             producer.run, {
                 AMO: ("after-commit-before-process", "mid-batch", "after-produce-before-flush"),
                 ALO: ("mid-batch", "after-produce-before-flush", "after-process-before-commit",
                       "after-commit"),
                 EO: ("mid-batch", "after-produce-before-flush", "in-transaction-before-commit",
                      "after-send-offsets-before-commit", "after-commit"),
             }, reads_input=False, scales=False),
    Scenario("consumer", "topic -> SQLite table; offsets in Kafka, or in the table (exactly_once)",
             consumer.run, {
                 AMO: ("after-poll-before-process", "after-commit-before-process", "mid-batch"),
                 ALO: ("after-poll-before-process", "mid-batch", "after-process-before-commit",
                       "after-commit"),
                 EO: ("after-poll-before-process", "mid-batch", "in-transaction-before-commit",
                      "after-send-offsets-before-commit", "after-commit"),
             }, produces=False),
    Scenario("consume-transform-produce", "topic -> add a fee -> topic; offsets in the transaction",
             ctp.run, {
                 AMO: ("after-poll-before-process", "after-commit-before-process", "mid-batch",
                       "after-produce-before-flush"),
                 ALO: ("after-poll-before-process", "mid-batch", "after-produce-before-flush",
                       "after-process-before-commit", "after-commit"),
                 EO: ("after-poll-before-process", "mid-batch", "after-produce-before-flush",
                      "in-transaction-before-commit", "after-send-offsets-before-commit",
                      "after-commit"),
             }),
    Scenario("running-count", "count per key: local store + changelog topic -> counts topic",
             running_count.run, {
                 AMO: ("after-poll-before-process", "after-commit-before-process",
                       "after-state-update-before-commit", "mid-batch", "after-produce-before-flush"),
                 ALO: ("after-poll-before-process", "after-state-update-before-commit",
                       "mid-batch", "after-produce-before-flush", "after-process-before-commit",
                       "after-commit"),
                 EO: ("after-poll-before-process", "after-state-update-before-commit", "mid-batch",
                      "after-produce-before-flush", "in-transaction-before-commit",
                      "after-send-offsets-before-commit", "after-commit"),
             }, stateful=True, scales=False),
]}


@dataclass
class ScenarioRun:
    """A scenario's audit plus how it ran (attempts, topics, fault proxy counters)."""

    report: AuditReport
    run: RunResult
    topics: dict[str, str]
    fault_stats: dict | None = None
    workdir: str | None = None
    inputs: list[dict] = field(default_factory=list, repr=False)
    history: list[dict] = field(default_factory=list, repr=False)  # the workers' events

    def summary(self) -> str:
        return self.report.summary()

    def to_json(self) -> str:
        return self.report.to_json()

    def timeline(self) -> str:
        """The workers' history, one line per event (``labkit.checking.timeline.text``)."""
        return timeline.text(self.history)

    def ownership(self) -> pd.DataFrame:
        """Which instance owned which partition, when (see ``labkit.checking.timeline.ownership``)."""
        return timeline.ownership(self.history)

    def rebalance_pause(self) -> float | None:
        """Seconds from the crash to its partitions being processed again."""
        return timeline.rebalance_pause(self.history)

    def takeover(self) -> timeline.Takeover | None:
        """How the group got over the crash (see ``labkit.checking.timeline.takeover``)."""
        return timeline.takeover(self.history)


def crash_points(name: str, guarantee: str | None = None) -> tuple[str, ...]:
    """The crash points a scenario's code passes (for one guarantee, or for any)."""
    scenario = _scenario(name)
    if guarantee is not None:
        return scenario.crash_points[check_guarantee(guarantee)]
    return tuple(p for p in crashpoints.CRASH_POINTS
                 if any(p in pts for pts in scenario.crash_points.values()))


def batch_size(records: int) -> int:
    """10 records a batch; smaller for tiny runs so a crash on the 2nd batch still fires."""
    return min(BATCH_SIZE, max(1, records // 4))


def run_detailed(name: str, bootstrap: str, guarantee: str, crash_at: str | None = None,
                 fault: str | None = None, records: int = 200, *, seed: int = 0,
                 hit: int = CRASH_HIT, isolation: str = "read_committed", keep_workdir: bool = False,
                 options: dict | None = None,
                 watch: Callable[[dict[str, str]], AbstractContextManager] | None = None,
                 inputs: list[dict] | None = None, instances: int = 1, partitions: int = 1,
                 group_protocol: str = "classic", crash_instance: int = 0,
                 kills: int = 0, trace: str | Path | None = None,
                 keep_topics: bool = True, code: Callable | None = None) -> ScenarioRun:
    """Run a Kafka scenario; ``options`` go to the pipeline (e.g. ``{"offset_delta": 0}``) and
    ``isolation`` is how the audited downstream consumer reads the output.

    ``watch(topics)`` is called with the topic names once they exist (and "history": the
    path of the run's history file) and its context is held while the workers run: a
    notebook passes a live dashboard factory here, e.g.
    ``watch=lambda t: Dashboard(bootstrap, t["output"])``.

    ``inputs`` replaces the generated records (e.g. ``data.load_csv("payments")``: each
    needs a unique ``id`` and a ``key``); ``records`` is then their number.

    ``instances`` workers join one consumer group (``group_protocol`` classic or consumer)
    over an input of ``partitions`` partitions; the crash fires in ``crash_instance``, which
    is also SIGKILLed ``kills`` times at random times (seeded by ``seed``).

    ``trace``: a file to write the workers' Kafka protocol exchanges to, one JSON object per
    request (``api``, ``version``, ``client_id``, ``correlation_id``, ``error``, ``ms``, ...),
    captured by the fault proxy the workers then talk through.

    ``keep_topics=False`` deletes the run's topics when it ends (also after a failure), as
    ``labkit scenario`` does; kept by default here, because a notebook's next cells look at
    them (``run.topics``).

    ``code``: a function written by the learner (e.g. in a notebook cell) that the workers run
    instead of the scenario's own pipeline (``labkit.pipelines.learner``): it gets the
    scenario's settings it names as parameters (``bootstrap``, ``input_topic``, ``output_topic``,
    ``group_id``, ``transactional_id``, ``instance_id``, ``batch_size``; the consumer's sink:
    ``db_path`` and ``sink_table``, the SQLite file and table the audit reads; the producer's
    source: ``records``, the list of payments to write), and
    its ``crash_point(...)`` calls are where ``crash_at`` kills it. The audit is the same."""
    scenario = _scenario(name)
    check_guarantee(guarantee)
    _instances(scenario, instances, partitions, crash_instance)
    check_group_protocol(group_protocol)
    if inputs is not None:
        records = len(inputs)
    check_records(records)
    _crash_point(scenario, guarantee, crash_at)
    spec = _fault(fault)
    if isolation not in ISOLATION_LEVELS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}, not {isolation!r}")
    options = _options(scenario, options or {})

    run_id = uuid.uuid4().hex[:8]
    # One stem for the run's topics, group id and transactional ids, put in the learner's
    # namespace once here (labkit.kafka.names), so every name derived from it carries the prefix.
    base = namespace.qualify(f"{name}-{guarantee}-{run_id}".replace("_", "-"))
    names_ = {"input": f"{base}-in", "output": f"{base}-out", "changelog": f"{base}-changelog",
              "progress": f"{base}-progress"}
    workdir = lab_home() / "runs" / base
    workdir.mkdir(parents=True, exist_ok=True)
    inputs = list(inputs) if inputs is not None else data.generate(records, seed=seed,
                                                                   keys=data.keys_for(partitions))
    kwargs = _worker_kwargs(scenario, guarantee, names_, base, workdir, inputs, records)
    kwargs.update(options)
    members = _members(scenario, kwargs, base, instances, group_protocol)
    worker = scenario.worker
    if code is not None:  # the learner's function, sent as the text of its cell
        worker, text = learner.run_code, learner.code_of(code)
        sink = {"sink_table": consumer.SINK_TABLE} if scenario.name == "consumer" else {}
        members = [{**m, **sink, "code": text, "function": code.__name__} for m in members]
    history_file = workdir / "history.jsonl"
    used = {k: v for k, v in names_.items() if k in _topics_used(scenario)}
    try:
        topics.create(bootstrap, names_["output"])
        if scenario.name == "running-count":
            topics.create(bootstrap, names_["changelog"], config={"cleanup.policy": "compact"})
        if scenario.name == "producer":
            topics.create(bootstrap, names_["progress"])
        else:
            data.load_into_topic(bootstrap, names_["input"], inputs, partitions=partitions)
        watched = {**used, "history": str(history_file)}  # a live view may follow the workers
        with _tracer(trace) as recorder, _proxy(bootstrap, spec, recorder) as proxy, \
                (watch(watched) if watch else nullcontext()):
            for member in members:
                member["bootstrap"] = proxy.bootstrap if proxy else bootstrap
            result = run_workers(worker, members, crash_at=crash_at, hit=hit,
                                 crash_instance=crash_instance, label=f"{name} [{guarantee}]",
                                 history_file=str(history_file), kills=kills, seed=seed)
            stats = proxy.stats() if proxy else None
        report = _audit(scenario, bootstrap, names_, workdir, inputs, guarantee, crash_at, fault,
                        isolation)
        events = history.read(history_file)
    finally:
        if not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        if not keep_topics:
            topics.delete(bootstrap, *names_.values())
    return ScenarioRun(report, result, used, stats, str(workdir) if keep_workdir else None, inputs,
                       events)


# --------------------------------------------------------------------------- internals


def _worker_kwargs(scenario: Scenario, guarantee: str, t: dict[str, str], base: str,
                   workdir: Path, inputs: list[dict], records: int) -> dict:
    common = {"guarantee": guarantee, "batch_size": batch_size(records)}
    if scenario.name == "producer":
        return {**common, "output_topic": t["output"], "progress_topic": t["progress"],
                "transactional_id": f"{base}-txn", "records": inputs}
    if scenario.name == "consumer":
        return {**common, "input_topic": t["input"], "group_id": base,
                "db_path": str(workdir / "sink.db")}
    if scenario.name == "consume-transform-produce":
        return {**common, "input_topic": t["input"], "output_topic": t["output"],
                "group_id": base, "transactional_id": f"{base}-txn"}
    return {**common, "input_topic": t["input"], "output_topic": t["output"],
            "changelog_topic": t["changelog"], "group_id": base,
            "transactional_id": f"{base}-txn", "state_dir": str(workdir / "state")}


def _members(scenario: Scenario, kwargs: dict, base: str, instances: int,
             group_protocol: str) -> list[dict]:
    """Each instance's worker kwargs. A lone instance under the classic protocol is a static
    member (group.instance.id): restarted after a crash, it takes its old place at once
    instead of waiting for its dead self's session to time out. (The consumer protocol
    refuses that, UNRELEASED_INSTANCE_ID, until the old session has expired.) Several
    instances are dynamic members with their own transactional.id, so the group moves a
    dead member's partitions to the others."""
    if not scenario.reads_input:
        return [kwargs]
    if instances == 1 and group_protocol == "classic":
        return [{**kwargs, "group_protocol": group_protocol, "instance_id": f"{base}-0"}]
    members = []
    for i in range(instances):
        member = {**kwargs, "group_protocol": group_protocol, "group_size": instances}
        if "transactional_id" in member:
            member["transactional_id"] = f"{base}-txn-{i}"
        members.append(member)
    return members


def _topics_used(scenario: Scenario) -> tuple[str, ...]:
    return {"producer": ("output", "progress"), "consumer": ("input",),
            "consume-transform-produce": ("input", "output"),
            "running-count": ("input", "output", "changelog")}[scenario.name]


def _audit(scenario: Scenario, bootstrap: str, t: dict[str, str], workdir: Path,
           inputs: list[dict], guarantee: str, crash_at: str | None, fault: str | None,
           isolation: str) -> AuditReport:
    if scenario.name == "consumer":
        return audit.audit_table(str(workdir / "sink.db"), consumer.SINK_TABLE, inputs,
                                 scenario.name, guarantee, crash_at=crash_at, fault=fault)
    return audit.audit_topic(bootstrap, t["output"], inputs, scenario.name, guarantee,
                             crash_at=crash_at, fault=fault, isolation=isolation,
                             state_field="count" if scenario.stateful else None)


@contextmanager
def deleted_after(bootstrap: str, names_: dict[str, str], keep: bool):
    """Delete a run's topics when the block ends, also after a failure (unless ``keep``)."""
    try:
        yield
    finally:
        if not keep:
            topics.delete(bootstrap, *names_.values())


def _proxy(bootstrap: str, spec, recorder: Callable[[dict], None] | None = None):
    if spec is None and recorder is None:
        return nullcontext(None)
    from labkit.faults.proxy import FaultProxy

    return FaultProxy(bootstrap, fault=spec, trace=recorder)


@contextmanager
def _tracer(path: str | Path | None):
    """A recorder writing each exchange as a JSON line to ``path`` (None: no recorder)."""
    if path is None:
        yield None
        return
    with open(path, "w", encoding="utf-8") as out:
        yield lambda entry: out.write(json.dumps(entry) + "\n")


def _scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}. Valid scenarios: {', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def check_guarantee(guarantee: str) -> str:
    if guarantee not in GUARANTEES:
        raise ValueError(f"unknown guarantee {guarantee!r}. Valid guarantees: {', '.join(GUARANTEES)}")
    return guarantee


def _instances(scenario: Scenario, instances: int, partitions: int, crash_instance: int) -> None:
    for what, n in (("instances", instances), ("partitions", partitions)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{what} must be a positive whole number, not {n!r}")
    if not scenario.scales and (instances, partitions) != (1, 1):
        raise ValueError(f"{scenario.name} runs as one instance over one partition (its state, "
                         "or its source position, is not split by partition); use "
                         "consume-transform-produce or consumer for groups")
    if not 0 <= crash_instance < instances:
        raise ValueError(f"crash_instance must be between 0 and {instances - 1}, not {crash_instance}")


def check_records(records: int) -> int:
    if not isinstance(records, int) or records < 1:
        raise ValueError(f"records must be a positive whole number, not {records!r}")
    return records


def _crash_point(scenario: Scenario, guarantee: str, crash_at: str | None) -> None:
    crashpoints.validate(crash_at)  # unknown anywhere: UnknownCrashPoint lists them all
    valid = scenario.crash_points[guarantee]
    if crash_at is not None and crash_at not in valid:
        raise ValueError(f"crash point {crash_at!r} is not on the path of {scenario.name} "
                         f"[{guarantee}]. Valid crash points here: {', '.join(valid)}")


def _fault(fault: str | None):
    if not fault:
        return None
    from labkit.faults.faultspec import parse_fault_spec

    return parse_fault_spec(fault)  # ValueError listing the valid forms


def _options(scenario: Scenario, options: dict) -> dict:
    fixed = {"bootstrap", "guarantee", "batch_size", "input_topic", "output_topic", "group_id",
             "transactional_id", "db_path", "state_dir", "changelog_topic", "progress_topic",
             "records", "group_protocol", "instance_id", "fencing", "max_batches", "group_size"}
    allowed = [p for p in inspect.signature(scenario.worker).parameters if p not in fixed]
    bad = [k for k in options if k not in allowed]
    if bad:
        raise ValueError(f"unknown option(s) {bad} for {scenario.name}; valid options: "
                         f"{', '.join(allowed) or 'none'}")
    return options


# --------------------------------------------------------------------------- the registry

OPTIONS = (
    Option("guarantee", REQUIRED, "at_most_once | at_least_once | exactly_once", GUARANTEES,
           short="-g"),
    Option("crash_at", None, "a crash point (see `labkit crash-points`)"),
    Option("fault", None, "a network fault, e.g. drop-ack:produce:1"),
    Option("records", 200, "how many input records", kind=int, short="-n"),
    Option("instances", 1, "worker processes in one consumer group", kind=int),
    Option("partitions", 1, "partitions of the input topic", kind=int),
    Option("group_protocol", "classic", "classic | consumer (KIP-848)", GROUP_PROTOCOLS),
    Option("kills", 0, "SIGKILL the crashing instance this many more times, at random times",
           kind=int),
    Option("trace", None, "write the workers' Kafka requests to this file (JSON lines)"),
    Option("isolation", "read_committed", "how the audit reads the output",
           tuple(ISOLATION_LEVELS)),
    Option("keep_topics", True, "keep the run's topics", kind=bool, cli_default=False),
    Option("seed", 0, "the input's seed and the kills' times", kind=int, cli=False),
    Option("hit", CRASH_HIT, "crash on this visit of the point", kind=int, cli=False),
    Option("crash_instance", 0, "the instance that crashes", kind=int, cli=False),
    Option("inputs", None, "records to use instead of generated ones", kind=list, cli=False),
    Option("options", None, "settings for the pipeline, e.g. {'offset_delta': 0}", kind=dict,
           cli=False),
    Option("keep_workdir", False, "keep the run's directory", kind=bool, cli=False),
)


def _registered(scenario: Scenario) -> Experiment:
    def body(context, **options) -> ScenarioRun:
        if options["instances"] > options["partitions"]:
            context.announce(f"note: {options['instances']} instances share "
                             f"{options['partitions']} partition(s): "
                             f"{options['instances'] - options['partitions']} instance(s) "
                             "will stay idle")
        return run_detailed(scenario.name, context.bootstrap, code=context.pipeline,
                            watch=context.watch, **options)

    def check(guarantee, crash_at, fault, records, instances, partitions, group_protocol,
              crash_instance, **_) -> None:  # before any broker starts
        _instances(scenario, instances, partitions, crash_instance)
        check_group_protocol(group_protocol)
        check_records(records)
        _crash_point(scenario, guarantee, crash_at)
        _fault(fault)

    return Experiment(scenario.name, scenario.description, body, OPTIONS, check=check,
                      pipeline="the worker's function",
                      crash_points=lambda guarantee=None: crash_points(scenario.name, guarantee))


for _scenario_ in SCENARIOS.values():
    register(_registered(_scenario_))
