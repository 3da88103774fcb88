"""The lab's reference pipelines as experiments: the producer, the consumer (a table sink),
consume-transform-produce and the running count, each at one of three guarantees, crashed
at a named point, killed at random, behind a network fault; or the learner's function in
their place (``pipeline=``), crashed at its own ``crash_point(...)`` calls.

    run = experiments.run("consume-transform-produce", guarantee="at_least_once",
                          crash_at="after-process-before-commit")
    print(run.summary())       # lost=0 duplicated=10 ...

Each is the same composition: a workload (generated payments with unique ids in the input
topic), its clients (``instances`` worker processes of one consumer group over
``partitions`` partitions), a nemesis (``CrashAt``, ``RandomKills``, ``ProxyFault``) and the
audit of its output (a topic, or the consumer's table).

Deterministic by construction: fixed seed, fixed batches, and the crash fires on the
``CRASH_HIT``-th visit of its point. Rebalances move partitions between instances, and the
audit must stay exact all the same.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from labkit.checking.checks import TableAudit, TopicAudit
from labkit.experiments import options as common
from labkit.experiments.context import RunContext
from labkit.experiments.parts import Topic, Workers, Workload
from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.faults import crashpoints
from labkit.faults.nemesis import Nemesis
from labkit.faults.process_faults import CrashAt, RandomKills
from labkit.faults.wire_faults import ProxyFault
from labkit.kafka.topics import ISOLATION_LEVELS
from labkit.pipelines import consumer, ctp, data, learner, producer, running_count
from labkit.pipelines.group import GROUP_PROTOCOLS, check_group_protocol
from labkit.pipelines.guarantee import GUARANTEES

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


# --------------------------------------------------------------------------- internals


def _worker_kwargs(scenario: Scenario, guarantee: str, run: RunContext) -> dict:
    """The settings every instance's worker gets (its bootstrap comes from the run)."""
    t, base = {role: run.topic_name(role) for role in ROLES}, run.base
    common = {"guarantee": guarantee, "batch_size": batch_size(len(run.inputs))}
    if scenario.name == "producer":
        return {**common, "output_topic": t["output"], "progress_topic": t["progress"],
                "transactional_id": f"{base}-txn", "records": run.inputs}
    if scenario.name == "consumer":
        return {**common, "input_topic": t["input"], "group_id": base,
                "db_path": str(run.workdir / "sink.db")}
    if scenario.name == "consume-transform-produce":
        return {**common, "input_topic": t["input"], "output_topic": t["output"],
                "group_id": base, "transactional_id": f"{base}-txn"}
    return {**common, "input_topic": t["input"], "output_topic": t["output"],
            "changelog_topic": t["changelog"], "group_id": base,
            "transactional_id": f"{base}-txn", "state_dir": str(run.workdir / "state")}


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
    common.records(200),
    Option("instances", 1, "worker processes in one consumer group", kind=int),
    Option("partitions", 1, "partitions of the input topic", kind=int),
    Option("group_protocol", "classic", "classic | consumer (KIP-848)", GROUP_PROTOCOLS),
    Option("kills", 0, "SIGKILL the crashing instance this many more times, at random times",
           kind=int),
    Option("trace", None, "write the workers' Kafka requests to this file (JSON lines)"),
    Option("isolation", "read_committed", "how the audit reads the output",
           tuple(ISOLATION_LEVELS)),
    common.keep_topics(True),
    common.seed("the input and the kills' times"),
    Option("hit", CRASH_HIT, "crash on this visit of the point", kind=int, cli=False),
    Option("crash_instance", 0, "the instance that crashes", kind=int, cli=False),
    Option("inputs", None, "records to use instead of generated ones", kind=list, cli=False),
    Option("options", None, "settings for the pipeline, e.g. {'offset_delta': 0}", kind=dict,
           cli=False),
    Option("keep_workdir", False, "keep the run's directory", kind=bool, cli=False),
)


ROLES = ("input", "output", "changelog", "progress")


def _workload(scenario: Scenario):
    def workload(o) -> Workload:
        inputs = list(o.inputs) if o.inputs is not None else data.generate(
            o.records, seed=o.seed, keys=data.keys_for(o.partitions))
        made = {"producer": (Topic("output"), Topic("progress")),
                "consumer": (),
                "consume-transform-produce": (Topic("output"),),
                "running-count": (Topic("output"),
                                  Topic("changelog", config={"cleanup.policy": "compact"}))}
        loaded = () if scenario.name == "producer" else \
            (Topic("input", o.partitions, loaded=True),)
        return Workload(f"{scenario.name}-{o.guarantee}", (*loaded, *made[scenario.name]),
                        inputs)
    return workload


def _clients(scenario: Scenario):
    def clients(run: RunContext) -> Workers:
        o = run.o
        if o.instances > o.partitions:
            run.announce(f"note: {o.instances} instances share {o.partitions} partition(s): "
                         f"{o.instances - o.partitions} instance(s) will stay idle")
        kwargs = {**_worker_kwargs(scenario, o.guarantee, run), **(o.options or {})}
        members = _members(scenario, kwargs, run.base, o.instances, o.group_protocol)
        worker = scenario.worker
        if run.pipeline is not None:  # the learner's function, sent as the text of its cell
            worker, text = learner.run_code, learner.code_of(run.pipeline)
            sink = {"sink_table": consumer.SINK_TABLE} if scenario.name == "consumer" else {}
            members = [{**m, **sink, "code": text, "function": run.pipeline.__name__}
                       for m in members]
        return Workers(worker, members, label=f"{scenario.name} [{o.guarantee}]",
                       max_attempts=max(4, o.kills + 2))
    return clients


def _nemesis(o) -> Nemesis:
    faults = [CrashAt(o.crash_at, o.hit, o.crash_instance)] if o.crash_at else []
    if o.kills:  # the crashing instance, SIGKILLed at seeded random moments too
        faults.append(RandomKills(o.kills, instance=o.crash_instance, seed=o.seed))
    if o.fault or o.trace:
        faults.append(ProxyFault(o.fault, trace_file=o.trace))
    return Nemesis(*faults)


def _checkers(scenario: Scenario):
    def checkers(o) -> list:
        if scenario.name == "consumer":
            return [TableAudit(scenario.name, o.guarantee, consumer.SINK_TABLE,
                               db=lambda run: str(run.workdir / "sink.db"),
                               crash_at=o.crash_at, fault=o.fault)]
        return [TopicAudit(scenario.name, o.guarantee, o.crash_at, o.fault,
                           isolation=o.isolation,
                           state_field="count" if scenario.stateful else None)]
    return checkers


def _facts(run: RunContext) -> dict:
    return {"inputs": run.inputs, "fault_stats": run.facts.get("fault_stats"),
            "workdir": str(run.workdir) if run.keep_workdir else None}


def _registered(scenario: Scenario) -> Experiment:
    def check(guarantee, crash_at, fault, records, instances, partitions, group_protocol,
              crash_instance, options, **_) -> None:  # before any broker starts
        _instances(scenario, instances, partitions, crash_instance)
        check_group_protocol(group_protocol)
        check_records(records)
        _crash_point(scenario, guarantee, crash_at)
        _fault(fault)
        _options(scenario, options or {})

    return Experiment(scenario.name, scenario.description, options=OPTIONS, check=check,
                      pipeline="the worker's function",
                      crash_points=lambda guarantee=None: crash_points(scenario.name, guarantee),
                      workload=_workload(scenario), clients=_clients(scenario),
                      nemesis=_nemesis, checkers=_checkers(scenario), facts=_facts)


for _scenario_ in SCENARIOS.values():
    register(_registered(_scenario_))
