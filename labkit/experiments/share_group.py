"""Share groups (KIP-932, queues for Kafka): N consumers take records from one partition and
acknowledge each one; a crash or a freeze redelivers what was not acknowledged.

    run = experiments.run("share-group", guarantee="at_least_once",
                          crash_at="after-process-before-ack")          # -> ShareRun
    run.summary(); run.delivery_counts; run.share_state

Its own runner and audit: a queue has no offsets to commit, and the broker may archive a
record (rejected, or past the delivery limit), which is not a loss.
"""
from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from labkit.checking import audit, history, timeline
from labkit.checking.audit import AuditReport
from labkit.experiments.registry import Experiment, Option, register
from labkit.experiments.scenarios import (AMO, ALO, CRASH_HIT, batch_size, check_guarantee,
                                          check_records, deleted_after)
from labkit.faults import crashpoints
from labkit.faults.runner import RunResult, run_frozen, run_workers
from labkit.faults.pool import target_name as runner_target
from labkit.kafka import names as namespace
from labkit.kafka import topics
from labkit.paths import lab_home
from labkit.pipelines import data, learner, share

SHARE = "share-group"
SHARE_CRASH_POINTS = {ALO: ("after-acquire-before-process", "after-process-before-ack", "after-ack"),
                      AMO: ("after-acquire-before-process", "after-ack")}


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
    history: list[dict] = field(default_factory=list, repr=False)  # the consumers' events

    def timeline(self) -> str:
        return timeline.text(self.history)

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


def share_group(bootstrap: str, guarantee: str = "at_least_once", crash_at: str | None = None,
                records: int = 40, *, instances: int = 1, partitions: int = 1,
                ack_mode: str = "explicit", poison: str | None = None, hit: int | None = None,
                seed: int = 0, group_protocol: str | None = None, trace=None,
                record_lock_ms: int | None = None, delivery_limit: int | None = None,
                freeze: bool = False, watch: Callable[[dict[str, str]], AbstractContextManager] | None = None,
                keep_topics: bool = True, pipeline: Callable | None = None) -> ShareRun:
    """``instances`` share consumers (processes) take ``records`` records from one partition;
    instance 0 is SIGKILLed at ``crash_at`` on its ``hit``-th visit and restarted (default:
    the 2nd record with explicit acknowledgement; the 1st poll with implicit, because the
    ShareConsumer of confluent-kafka 2.16.1 ignores max.poll.records and one poll returns
    every record the broker handed over).

    ``poison="release"|"reject"`` makes the input's third record fail every time it is
    processed: released (redelivered until the broker archives it at its delivery limit)
    or rejected (archived at once). ``watch(topics)`` as in ``scenarios.run_detailed`` (its dict also
    has "group", the share group's id, for a live view of its state). ``record_lock_ms``
    and ``delivery_limit`` set this group's record lock and delivery limit (the broker's:
    10 s and 5).

    ``freeze=True``: the consumer is *frozen* (SIGSTOP) at ``crash_at`` instead of killed,
    for its records' lock (this group's: ``record_lock_ms``, default ``FREEZE_LOCK_MS``) plus
    ``FREEZE_MARGIN_S``. Its connection stays open, so only the lock expiring frees its
    records. Thawed (SIGCONT), its late acknowledgement is refused (``refused_acks``), it
    drops the rest of that stale poll, polls again and gets the records once more
    (delivery count 2): the one it had processed is processed twice.

    ``keep_topics`` as in ``scenarios.run_detailed``. ``pipeline``: the learner's share
    consumer (a function in a notebook cell, run as the worker in place of ``share.run``),
    called with the settings it names of ``bootstrap``, ``input_topic``, ``output_topic``,
    ``group_id``, ``poison_ids``, ``guarantee``, ``ack_mode``, ``poison``, ``batch_size``;
    it writes one record per attempt to ``output_topic`` as ``share.run`` does (``id``,
    ``delivery_count``, ``outcome``; ``consumer`` optional)."""
    from labkit.checking.checkers import Attempt
    from labkit.kafka.inspect import Inspector
    from labkit.kafka.inspect.share import share_state

    check_settings(guarantee, crash_at, records, instances, ack_mode, poison, freeze,
                   delivery_limit)
    if partitions != 1 or trace or group_protocol not in (None, "classic"):
        raise ValueError(f"{SHARE} runs its consumers on one partition, with their own "
                         "protocol (ShareGroupHeartbeat): drop --partitions, --group-protocol "
                         "and --trace")
    if freeze:
        record_lock_ms = record_lock_ms or FREEZE_LOCK_MS
    hit = hit or (CRASH_HIT if ack_mode == "explicit" else 1)
    inputs = data.generate(records, seed=seed)
    poison_ids = [inputs[min(2, records - 1)]["id"]] if poison else []
    base = namespace.qualify(f"share-{guarantee}-{uuid.uuid4().hex[:8]}".replace("_", "-"))
    names_ = {"input": f"{base}-in", "output": f"{base}-out"}
    with deleted_after(bootstrap, names_, keep_topics):  # as in scenarios.run_detailed
        data.load_into_topic(bootstrap, names_["input"], inputs)
        topics.create(bootstrap, names_["output"])
        share.prepare_group(bootstrap, base, record_lock_ms, delivery_limit)
        member = {"bootstrap": bootstrap, "input_topic": names_["input"],
                  "output_topic": names_["output"], "group_id": base, "guarantee": guarantee,
                  "batch_size": batch_size(records), "ack_mode": ack_mode,
                  "poison_ids": poison_ids, "poison": poison or "release"}
        worker = share.run
        if pipeline is not None:  # the learner's function, sent as the text of its cell
            learner.check_parameters(pipeline, set(member))
            worker = learner.run_code
            member = {**member, "code": learner.code_of(pipeline), "function": pipeline.__name__}
        workdir = lab_home() / "runs" / base
        workdir.mkdir(parents=True, exist_ok=True)
        frozen_s = None
        try:
            with watch({**names_, "group": base}) if watch else nullcontext():
                if freeze:
                    result, frozen_s = _share_frozen(worker, member, crash_at, hit, guarantee,
                                                     record_lock_ms, str(workdir / "history.jsonl"))
                else:
                    result = run_workers(worker, [dict(member) for _ in range(instances)],
                                         crash_at=crash_at, hit=hit, label=f"{SHARE} [{guarantee}]",
                                         history_file=str(workdir / "history.jsonl"), seed=seed)
            events = history.read(workdir / "history.jsonl")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        log = topics.read(bootstrap, names_["output"])
        attempts = [Attempt(str(r.value["id"]), str(r.value.get("consumer", "")),
                            r.value.get("delivery_count"), r.value.get("outcome", "processed"))
                    for r in log]
        with Inspector(bootstrap) as inspector:
            state = share_state(inspector, base, names_["input"])
    run = _audit_share(guarantee, crash_at, inputs, attempts, result, names_, base, state,
                       delivery_limit or share.DELIVERY_LIMIT)
    run.refused_acks = [{"consumer": e["instance"], "offsets": e.get("offsets"), "error": err}
                        for e in events if e["kind"] == "ack-refused"
                        for err in e["errors"].values()]
    run.frozen_s = frozen_s
    run.history = events
    return run


# A frozen consumer's records wait for their lock: this group's lock for that lesson. Long
# enough that the consumer, thawed, ACCEPTs the records it then gets again before *their*
# locks expire on a loaded machine (it works through them one by one); short enough to wait.
FREEZE_LOCK_MS = 3000
# How long past its lock the consumer stays frozen: the lock surely expired (it started at
# the fetch, before the freeze) whatever the machine's load.
FREEZE_MARGIN_S = 2.0


def _share_frozen(worker: Callable, member: dict, crash_at: str, hit: int, guarantee: str,
                  lock_ms: int, history_file: str) -> tuple[RunResult, float]:
    """``share_group(freeze=True)``: the consumer frozen (SIGSTOP) past its records' lock,
    thawed (SIGCONT), run to its end; as a RunResult (nothing crashed, one attempt)."""
    started = time.monotonic()
    frozen_s = run_frozen(worker, dict(member), stall_at=crash_at,
                          frozen_s=lock_ms / 1000 + FREEZE_MARGIN_S, hit=hit,
                          label=f"{SHARE} [{guarantee}] frozen at {crash_at}",
                          history_file=history_file)
    result = RunResult(target=runner_target(worker), crash_at=crash_at, hit=hit, attempts=1,
                       exit_codes=[0], total_s=round(time.monotonic() - started, 3))
    return result, frozen_s


def _audit_share(guarantee: str, crash_at: str | None, inputs: list[dict], attempts: list,
                 result: RunResult, names_: dict[str, str], group: str, state,
                 delivery_limit: int) -> ShareRun:
    """The queue's audit: duplicated = processed more than once, lost = never processed and
    not archived by the broker, archived = given up on (rejected, or the delivery limit)."""
    from labkit.checking import checkers

    ids = [r["id"] for r in inputs]
    archived_ids = set(checkers.archived_ids(ids, attempts, delivery_limit))
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


def check_settings(guarantee: str, crash_at: str | None, records: int, instances: int = 1,
                   ack_mode: str = "explicit", poison: str | None = None, freeze: bool = False,
                   delivery_limit: int | None = None, **_: object) -> None:
    """A ValueError that says what to use, before anything is written."""
    if guarantee == "exactly_once":
        raise ValueError(share.NO_EXACTLY_ONCE)
    check_guarantee(guarantee)
    if not isinstance(instances, int) or instances < 1:
        raise ValueError(f"instances must be a positive whole number, not {instances!r}")
    check_records(records)
    crashpoints.validate(crash_at)
    if crash_at is not None and crash_at not in SHARE_CRASH_POINTS[guarantee]:
        raise ValueError(f"crash point {crash_at!r} is not on the path of {SHARE} [{guarantee}]. "
                         f"Valid crash points here: {', '.join(SHARE_CRASH_POINTS[guarantee])}")
    if freeze and (crash_at is None or instances != 1):
        raise ValueError("--freeze stalls instance 0 at its --crash-at point past its record "
                         "lock, then thaws it: give --crash-at, and no --instances")
    share.check_options(guarantee, ack_mode, poison or "release", ["poison"] if poison else [])
    low, high = share.DELIVERY_LIMIT_RANGE
    if delivery_limit is not None and (not isinstance(delivery_limit, int)
                                       or not low <= delivery_limit <= high):
        raise ValueError(f"delivery_limit must be a whole number from {low} to {high} (the "
                         f"range Kafka accepts for a group's share.delivery.count.limit), "
                         f"not {delivery_limit!r}")


def crash_points(guarantee: str | None = None) -> tuple[str, ...]:
    """The crash points a share consumer's code passes (for one guarantee, or for any)."""
    if guarantee is not None:
        return SHARE_CRASH_POINTS.get(check_guarantee(guarantee), ())
    return tuple(dict.fromkeys(p for points in SHARE_CRASH_POINTS.values() for p in points))


def _run(context, **options) -> ShareRun:
    return share_group(context.bootstrap, watch=context.watch, pipeline=context.pipeline,
                       **options)


register(Experiment(
    SHARE, "share consumers take records from one partition; a crash or a freeze redelivers",
    _run, where="lab", crash_points=crash_points, check=check_settings,
    pipeline="the share consumer's function", options=(
        Option("guarantee", "at_least_once", "at_most_once | at_least_once (a queue has no "
               "exactly-once)", short="-g"),
        Option("crash_at", None, "a crash point (see `labkit crash-points`)"),
        Option("records", 40, "how many input records", kind=int, short="-n"),
        Option("instances", 1, "share consumers (processes)", kind=int),
        Option("ack_mode", "explicit", "explicit | implicit acknowledgement",
               ("explicit", "implicit")),
        Option("poison", None, "a poison record, release | reject", ("release", "reject")),
        Option("freeze", False, "freeze (SIGSTOP) the consumer at --crash-at past its record "
               "lock, then thaw it", kind=bool),
        Option("hit", None, "crash on this visit of the point", kind=int, cli=False),
        Option("seed", 0, "the input's seed", kind=int, cli=False),
        Option("record_lock_ms", None, "this group's record lock", kind=int, cli=False),
        Option("delivery_limit", None, "this group's delivery limit (the broker's: 5)",
               kind=int),
        Option("keep_topics", True, "keep the run's topics", kind=bool, cli_default=False),
    )))
