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
import time
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
from labkit.faults.runner import RunResult, run_frozen, run_workers, run_zombie
from labkit.faults.runner import target_name as runner_target
from labkit.paths import lab_home
from labkit.pipelines import consumer, ctp, learner, producer, running_count, share
from labkit.pipelines.group import check_group_protocol
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
# The zombie experiment (``zombie_rebalance``): not a pipeline of its own but ctp's exactly_once
# under a stall and a rebalance, so it is listed with the scenarios and dispatched apart.
ZOMBIE = "zombie-rebalance"
# Share groups (KIP-932): N consumers take records from one partition, acknowledge each;
# its own runner and audit (a queue: no offsets, records may be archived), see share_group.
SHARE = "share-group"
SHARE_CRASH_POINTS = {ALO: ("after-acquire-before-process", "after-process-before-ack", "after-ack"),
                      AMO: ("after-acquire-before-process", "after-ack")}
FENCING_MODES = ctp.FENCING_MODES


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

    def ownership(self) -> pd.DataFrame:
        """Which instance owned which partition, when (see ``labkit.checking.timeline.ownership``)."""
        return timeline.ownership(self.history)

    def rebalance_pause(self) -> float | None:
        """Seconds from the crash to its partitions being processed again."""
        return timeline.rebalance_pause(self.history)

    def takeover(self) -> timeline.Takeover | None:
        """How the group got over the crash (see ``labkit.checking.timeline.takeover``)."""
        return timeline.takeover(self.history)


def _spark_scenarios() -> dict[str, Callable[..., AuditReport]]:
    from labkit.spark.scenarios import SPARK_SCENARIOS

    return SPARK_SCENARIOS


def names() -> list[str]:
    return [*SCENARIOS, ZOMBIE, SHARE, *_spark_scenarios()]


def crash_points(name: str, guarantee: str | None = None) -> tuple[str, ...]:
    """The crash points a scenario's code passes (for one guarantee, or for any)."""
    if name == ZOMBIE:
        return ()  # it stalls at one fixed point instead of crashing
    if name == SHARE:
        if guarantee is not None:
            return SHARE_CRASH_POINTS.get(_guarantee(guarantee), ())
        return tuple(dict.fromkeys(p for pts in SHARE_CRASH_POINTS.values() for p in pts))
    scenario = _scenario(name)
    if guarantee is not None:
        return scenario.crash_points[_guarantee(guarantee)]
    return tuple(p for p in crashpoints.CRASH_POINTS
                 if any(p in pts for pts in scenario.crash_points.values()))


def batch_size(records: int) -> int:
    """10 records a batch; smaller for tiny runs so a crash on the 2nd batch still fires."""
    return min(BATCH_SIZE, max(1, records // 4))


def run(name: str, guarantee: str, crash_at: str | None = None, fault: str | None = None,
        records: int = 200, bootstrap: str | None = None, keep_topics: bool = True,
        **options) -> AuditReport:
    """Run scenario ``name`` under ``guarantee`` and return its audit (see ``run_detailed``;
    ``keep_topics=False`` deletes the run's topics at its end, as ``labkit scenario`` does)."""
    if name == ZOMBIE:
        if crash_at or fault:
            raise ValueError(f"{ZOMBIE} stalls one instance at a fixed point; it takes no "
                             "--crash-at or --fault (choose --fencing group | none)")
        return zombie_rebalance(guarantee, records=records, bootstrap=bootstrap,
                                keep_topics=keep_topics, **options).report
    if name == SHARE:
        if fault:
            raise ValueError(f"{SHARE} takes --crash-at, not --fault")
        return share_group(guarantee, crash_at, records=records, bootstrap=bootstrap,
                           keep_topics=keep_topics, **options).report
    if name in _spark_scenarios() and name not in SCENARIOS:
        if fault:
            raise ValueError(f"network faults are not available for the Spark scenario {name!r}; "
                             "use --crash-at")
        if options.get("trace"):
            raise ValueError(f"--trace records Kafka scenarios' workers; the Spark scenario "
                             f"{name!r} talks to Kafka from its JVM")
        if options.get("instances", 1) != 1 or options.get("partitions", 1) != 1:
            raise ValueError(f"the Spark scenario {name!r} runs one query over one partition; "
                             "--instances and --partitions apply to the Kafka scenarios")
        crashpoints.validate(crash_at)
        _guarantee(guarantee)
        _records(records)
        return _spark_scenarios()[name](bootstrap or _ensure_bootstrap(), guarantee, crash_at,
                                        records, keep_topics=keep_topics)
    return run_detailed(name, guarantee, crash_at, fault, records, bootstrap,
                        keep_topics=keep_topics, **options).report


def run_detailed(name: str, guarantee: str, crash_at: str | None = None, fault: str | None = None,
                 records: int = 200, bootstrap: str | None = None, *, seed: int = 0,
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
    scenario's settings it names as parameters (``bootstrap``, ``input_topic``,
    ``output_topic``, ``group_id``, ``transactional_id``, ``instance_id``, ``batch_size``), and
    its ``crash_point(...)`` calls are where ``crash_at`` kills it. The audit is the same."""
    scenario = _scenario(name)
    if code is not None and not scenario.reads_input:
        raise ValueError(f"code= replaces a pipeline that reads an input topic, not {name!r}")
    _guarantee(guarantee)
    _instances(scenario, instances, partitions, crash_instance)
    check_group_protocol(group_protocol)
    if inputs is not None:
        records = len(inputs)
    _records(records)
    _crash_point(scenario, guarantee, crash_at)
    spec = _fault(fault)
    if isolation not in ISOLATION_LEVELS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}, not {isolation!r}")
    options = _options(scenario, options or {})
    bootstrap = bootstrap or _ensure_bootstrap()

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
        members = [{**m, "code": text, "function": code.__name__} for m in members]
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


@dataclass
class ZombieRun:
    """The zombie-after-rebalance experiment: the audit, and what the zombie was told."""

    report: AuditReport
    fencing: str
    zombie_error: str | None  # the group coordinator's refusal, None if the commit went through
    stalled_s: float
    history: list[dict] = field(default_factory=list, repr=False)


def zombie_rebalance(guarantee: str = "exactly_once", fencing: str = "group", records: int = 40,
                     bootstrap: str | None = None, group_protocol: str = "classic",
                     keep_topics: bool = True) -> ZombieRun:
    """Instance A reads a batch and writes its output inside a transaction, then freezes
    (SIGSTOP) before sending its offsets. B joins; once A's session times out the group gives
    B the partition, and B processes everything, A's batch included. Then A wakes up and
    tries to commit its transaction.

    ``fencing="group"``: A's offsets carry its group generation; the broker refuses them
    (KIP-447), A aborts, nothing is duplicated. ``fencing="none"``: the offsets carry the
    group id only (the pre-KIP-447 pattern); A's commit succeeds and its batch is duplicated.
    ``keep_topics`` as in ``run_detailed``.
    """
    if guarantee != "exactly_once":
        raise ValueError(f"{ZOMBIE} is an exactly_once experiment (zombie fencing); "
                         f"not {guarantee!r}")
    if fencing not in FENCING_MODES:
        raise ValueError(f"unknown fencing {fencing!r}; choose one of {', '.join(FENCING_MODES)}")
    check_group_protocol(group_protocol)
    _records(records)
    bootstrap = bootstrap or _ensure_bootstrap()
    base = namespace.qualify(f"zombie-{fencing}-{uuid.uuid4().hex[:8]}")  # as in run_detailed
    names_ = {"input": f"{base}-in", "output": f"{base}-out"}
    workdir = lab_home() / "runs" / base
    workdir.mkdir(parents=True, exist_ok=True)
    inputs = data.generate(records)
    common = {"bootstrap": bootstrap, "input_topic": names_["input"],
              "output_topic": names_["output"], "group_id": base, "guarantee": guarantee,
              "batch_size": batch_size(records), "fencing": fencing,
              "group_protocol": group_protocol}
    history_file = workdir / "history.jsonl"
    try:
        data.load_into_topic(bootstrap, names_["input"], inputs)
        topics.create(bootstrap, names_["output"])
        # A stops after its one late batch: the audit then counts what that commit adds.
        outcome = run_zombie(ctp.run, {**common, "transactional_id": f"{base}-a", "max_batches": 1},
                             {**common, "transactional_id": f"{base}-b"},
                             stall_at="in-transaction-before-commit", label=f"{ZOMBIE} [{fencing}]",
                             history_file=str(history_file))
        report = audit.audit_topic(bootstrap, names_["output"], inputs, ZOMBIE, guarantee,
                                   crash_at=None, fault="zombie")  # A stalled, then woke
        events = history.read(history_file)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if not keep_topics:
            topics.delete(bootstrap, *names_.values())
    errors = [e["error"] for e in events if e["kind"] == "fenced" and e["instance"] == "0"]
    return ZombieRun(report, fencing, errors[0] if errors else None, outcome.stalled_s, events)


@dataclass
class ShareRun:
    """A share-group run: the audit (lost, duplicated = processed twice), what the broker
    archived, the delivery counts and each consumer's order, and the share coordinator's
    stored state of the partition at the end (``labkit.kafka.inspect.share``)."""

    report: AuditReport
    run: RunResult
    topics: dict[str, str]
    group: str
    archived: int
    delivery_counts: dict[int, int]  # highest delivery count -> records (1: delivered once)
    processed_by: dict[str, int]  # consumer -> records it processed
    out_of_order: dict[str, int]  # consumer -> records it processed after a later one
    share_state: object  # labkit.kafka.inspect.share.ShareState
    attempts: list = field(default_factory=list, repr=False)  # checkers.Attempt, log order
    # The acknowledgements the broker refused, as the consumers' commit_sync reported them:
    # {"consumer", "offsets" (the acknowledged record's), "error"} (a frozen run's late ACCEPT).
    refused_acks: list[dict] = field(default_factory=list)
    frozen_s: float | None = None  # freeze=True: how long instance 0 stayed frozen

    def to_dict(self) -> dict:
        """``labkit scenario --json``'s keys, then the queue's own (appended)."""
        return {**self.report.to_dict(), "archived": self.archived,
                "delivery_counts": {str(k): v for k, v in self.delivery_counts.items()},
                "processed_by": self.processed_by, "out_of_order": self.out_of_order,
                "share_state": self.share_state.counts(), "seconds": self.run.total_s,
                "refused_acks": self.refused_acks, "frozen_s": self.frozen_s}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def summary(self) -> str:
        """The audit's summary plus one stable line for the queue (nbval compares both)."""
        text = (f"{self.report.summary()}\n  archived={self.archived} delivery counts "
                f"(highest per record -> records): {self.delivery_counts}")
        if self.refused_acks:  # only when the broker refused one (a lock that expired)
            errors = sorted({a["error"].split(",")[0].removeprefix("KafkaError{code=")
                             for a in self.refused_acks})
            text += f"\n  acknowledgements refused: {len(self.refused_acks)} ({', '.join(errors)})"
        return text


def share_group(guarantee: str = "at_least_once", crash_at: str | None = None, records: int = 40,
                bootstrap: str | None = None, *, instances: int = 1, partitions: int = 1,
                ack_mode: str = "explicit", poison: str | None = None, hit: int | None = None,
                seed: int = 0, group_protocol: str | None = None, trace=None,
                record_lock_ms: int | None = None, freeze: bool = False,
                watch: Callable[[dict[str, str]], AbstractContextManager] | None = None,
                keep_topics: bool = True) -> ShareRun:
    """``instances`` share consumers (processes) take ``records`` records from one partition;
    instance 0 is SIGKILLed at ``crash_at`` on its ``hit``-th visit and restarted (default:
    the 2nd record with explicit acknowledgement; the 1st poll with implicit, because the
    ShareConsumer of confluent-kafka 2.16.1 ignores max.poll.records and one poll returns
    every record the broker handed over).

    ``poison="release"|"reject"`` makes the input's third record fail every time it is
    processed: released (redelivered until the broker archives it at its delivery limit)
    or rejected (archived at once). ``watch(topics)`` as in ``run_detailed`` (its dict also
    has "group", the share group's id, for a live view of its state). ``record_lock_ms``
    sets this group's record lock (the broker's: 10 s).

    ``freeze=True``: the consumer is *frozen* (SIGSTOP) at ``crash_at`` instead of killed,
    for its records' lock (this group's: ``record_lock_ms``, default ``FREEZE_LOCK_MS``) plus
    ``FREEZE_MARGIN_S``. Its connection stays open, so only the lock expiring frees its
    records. Thawed (SIGCONT), its late acknowledgement is refused (``refused_acks``), it
    drops the rest of that stale poll, polls again and gets the records once more
    (delivery count 2): the one it had processed is processed twice.

    ``keep_topics`` as in ``run_detailed``."""
    from labkit.checking.checkers import Attempt
    from labkit.kafka.inspect import Inspector
    from labkit.kafka.inspect.share import share_state

    if guarantee == "exactly_once":
        raise ValueError(share.NO_EXACTLY_ONCE)
    _guarantee(guarantee)
    if partitions != 1 or trace or group_protocol not in (None, "classic"):
        raise ValueError(f"{SHARE} runs its consumers on one partition, with their own "
                         "protocol (ShareGroupHeartbeat): drop --partitions, --group-protocol "
                         "and --trace")
    if not isinstance(instances, int) or instances < 1:
        raise ValueError(f"instances must be a positive whole number, not {instances!r}")
    _records(records)
    crashpoints.validate(crash_at)
    if crash_at is not None and crash_at not in SHARE_CRASH_POINTS[guarantee]:
        raise ValueError(f"crash point {crash_at!r} is not on the path of {SHARE} [{guarantee}]. "
                         f"Valid crash points here: {', '.join(SHARE_CRASH_POINTS[guarantee])}")
    if freeze:
        if crash_at is None or instances != 1:
            raise ValueError("--freeze stalls instance 0 at its --crash-at point past its record "
                             "lock, then thaws it: give --crash-at, and no --instances")
        record_lock_ms = record_lock_ms or FREEZE_LOCK_MS
    hit = hit or (CRASH_HIT if ack_mode == "explicit" else 1)
    inputs = data.generate(records, seed=seed)
    poison_ids = [inputs[min(2, records - 1)]["id"]] if poison else []
    share.check_options(guarantee, ack_mode, poison or "release", poison_ids)
    bootstrap = bootstrap or _ensure_bootstrap()
    base = namespace.qualify(f"share-{guarantee}-{uuid.uuid4().hex[:8]}".replace("_", "-"))
    names_ = {"input": f"{base}-in", "output": f"{base}-out"}
    with _deleted_after(bootstrap, names_, keep_topics):  # as in run_detailed
        data.load_into_topic(bootstrap, names_["input"], inputs)
        topics.create(bootstrap, names_["output"])
        share.prepare_group(bootstrap, base, record_lock_ms)
        member = {"bootstrap": bootstrap, "input_topic": names_["input"],
                  "output_topic": names_["output"], "group_id": base, "guarantee": guarantee,
                  "batch_size": batch_size(records), "ack_mode": ack_mode,
                  "poison_ids": poison_ids, "poison": poison or "release"}
        workdir = lab_home() / "runs" / base
        workdir.mkdir(parents=True, exist_ok=True)
        frozen_s = None
        try:
            with watch({**names_, "group": base}) if watch else nullcontext():
                if freeze:
                    result, frozen_s = _share_frozen(member, crash_at, hit, guarantee,
                                                     record_lock_ms, str(workdir / "history.jsonl"))
                else:
                    result = run_workers(share.run, [dict(member) for _ in range(instances)],
                                         crash_at=crash_at, hit=hit, label=f"{SHARE} [{guarantee}]",
                                         history_file=str(workdir / "history.jsonl"), seed=seed)
            events = history.read(workdir / "history.jsonl")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        log = topics.read(bootstrap, names_["output"])
        attempts = [Attempt(str(r.value["id"]), str(r.value["consumer"]), r.value["delivery_count"],
                            r.value["outcome"]) for r in log]
        with Inspector(bootstrap) as inspector:
            state = share_state(inspector, base, names_["input"])
    run = _audit_share(guarantee, crash_at, inputs, attempts, result, names_, base, state)
    run.refused_acks = [{"consumer": e["instance"], "offsets": e.get("offsets"), "error": err}
                        for e in events if e["kind"] == "ack-refused"
                        for err in e["errors"].values()]
    run.frozen_s = frozen_s
    return run


# A frozen consumer's records wait for their lock: this group's lock for that lesson. Long
# enough that the consumer, thawed, ACCEPTs the records it then gets again before *their*
# locks expire on a loaded machine (it works through them one by one); short enough to wait.
FREEZE_LOCK_MS = 3000
# How long past its lock the consumer stays frozen: the lock surely expired (it started at
# the fetch, before the freeze) whatever the machine's load.
FREEZE_MARGIN_S = 2.0


def _share_frozen(member: dict, crash_at: str, hit: int, guarantee: str, lock_ms: int,
                  history_file: str) -> tuple[RunResult, float]:
    """``share_group(freeze=True)``: the consumer frozen (SIGSTOP) past its records' lock,
    thawed (SIGCONT), run to its end; as a RunResult (nothing crashed, one attempt)."""
    started = time.monotonic()
    frozen_s = run_frozen(share.run, dict(member), stall_at=crash_at,
                          frozen_s=lock_ms / 1000 + FREEZE_MARGIN_S, hit=hit,
                          label=f"{SHARE} [{guarantee}] frozen at {crash_at}",
                          history_file=history_file)
    result = RunResult(target=runner_target(share.run), crash_at=crash_at, hit=hit, attempts=1,
                       exit_codes=[0], total_s=round(time.monotonic() - started, 3))
    return result, frozen_s


def _audit_share(guarantee: str, crash_at: str | None, inputs: list[dict], attempts: list,
                 result: RunResult, names_: dict[str, str], group: str, state) -> ShareRun:
    """The queue's audit: duplicated = processed more than once, lost = never processed and
    not archived by the broker, archived = given up on (rejected, or the delivery limit)."""
    from labkit.checking import checkers

    ids = [r["id"] for r in inputs]
    archived_ids = set(checkers.archived_ids(ids, attempts, share.DELIVERY_LIMIT))
    processed = [a.id for a in attempts if a.outcome == "processed"]
    lost = checkers.lost_write([i for i in ids if i not in archived_ids], processed)
    dup = checkers.duplicate(ids, processed)
    report = audit.report_of(SHARE, guarantee, [lost, dup], produced=len(ids),
                             delivered_unique=len(set(ids) & set(processed)), crash_at=crash_at)
    order = checkers.order_per_consumer(ids, attempts)
    by: dict[str, int] = {}
    for a in attempts:
        if a.outcome == "processed":
            by[a.consumer] = by.get(a.consumer, 0) + 1
    return ShareRun(report, result, names_, group, len(archived_ids),
                    checkers.delivery_counts(attempts),
                    dict(sorted(by.items())), {c: r.count for c, r in order.items()}, state,
                    attempts)


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
def _deleted_after(bootstrap: str, names_: dict[str, str], keep: bool):
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


def _ensure_bootstrap() -> str:
    from labkit.kafka import cluster

    namespace.namespace()  # a bad LABKIT_NAMESPACE fails here, before a broker is started
    return cluster.ensure().bootstrap


def _scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}. Valid scenarios: {', '.join(names())}")
    return SCENARIOS[name]


def _guarantee(guarantee: str) -> str:
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


def _records(records: int) -> int:
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
