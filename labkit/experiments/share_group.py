"""Share groups (KIP-932, queues for Kafka): N consumers take records from one partition and
acknowledge each one; a crash or a freeze redelivers what was not acknowledged.

    run = experiments.run("share-group", guarantee="at_least_once",
                          crash_at="after-process-before-ack")
    run.summary(); run.delivery_counts; run.share_state; run.attempts

The parts: the input (its third record a poison one, with ``poison``) and output topics,
the share group set up with its record lock and delivery limit; ``instances`` share
consumers (``labkit.pipelines.share.run``, or the learner's) as supervised workers, each
writing one output record per attempt; the nemesis kills instance 0 at ``crash_at``
(``CrashAt``, restarted), or with ``freeze`` freezes it there past its records' lock and
thaws it (``StallAt``, ``Thaw``); the queue's audit (``QueueAudit``: a queue has no offsets
to commit, and the broker may archive a record, which is not a loss) and the share
coordinator's stored state of the partition at the end (``share_state``).
"""
from __future__ import annotations

from labkit.checking.checks import QueueAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workers, Workload
from labkit.experiments.registry import Experiment, Option, register
from labkit.experiments.scenarios import AMO, ALO, CRASH_HIT, batch_size, check_guarantee
from labkit.faults import crashpoints
from labkit.faults.nemesis import Nemesis, after
from labkit.faults.process_faults import CrashAt, Frozen, StallAt, Thaw
from labkit.pipelines import data, learner, share

SHARE = "share-group"
SHARE_CRASH_POINTS = {ALO: ("after-acquire-before-process", "after-process-before-ack", "after-ack"),
                      AMO: ("after-acquire-before-process", "after-ack")}
# A frozen consumer's records wait for their lock: this group's lock for that lesson. Long
# enough that the consumer, thawed, ACCEPTs the records it then gets again before *their*
# locks expire on a loaded machine (it works through them one by one); short enough to wait.
FREEZE_LOCK_MS = 3000
# How long past its lock the consumer stays frozen: the lock surely expired (it started at
# the fetch, before the freeze) whatever the machine's load.
FREEZE_MARGIN_S = 2.0


def _lock_ms(o) -> int | None:
    return o.record_lock_ms or (FREEZE_LOCK_MS if o.freeze else None)


def _hit(o) -> int:
    """The default: the 2nd record with explicit acknowledgement; the 1st poll with implicit,
    because the ShareConsumer of confluent-kafka 2.16.1 ignores max.poll.records and one
    poll returns every record the broker handed over."""
    return o.hit or (CRASH_HIT if o.ack_mode == "explicit" else 1)


def _workload(o) -> Workload:
    inputs = data.generate(o.records, seed=o.seed)
    return Workload(f"share-{o.guarantee}", (Topic("input", loaded=True), Topic("output")),
                    inputs)


def _clients(run) -> Workers:
    """The share group set up (its lock, its delivery limit), then its consumers. The
    learner's function is sent as the text of its cell, called with the settings it names
    of ``bootstrap``, ``input_topic``, ``output_topic``, ``group_id``, ``poison_ids``,
    ``guarantee``, ``ack_mode``, ``poison``, ``batch_size``; it writes one record per
    attempt to ``output_topic`` as ``share.run`` does."""
    o = run.o
    share.prepare_group(run.bootstrap, run.group_id, _lock_ms(o), o.delivery_limit)
    poison_ids = [run.inputs[min(2, o.records - 1)]["id"]] if o.poison else []
    member = {"input_topic": run.topics["input"], "output_topic": run.topics["output"],
              "group_id": run.group_id, "guarantee": o.guarantee,
              "batch_size": batch_size(o.records), "ack_mode": o.ack_mode,
              "poison_ids": poison_ids, "poison": o.poison or "release"}
    worker = share.run
    if run.pipeline is not None:  # the learner's function, sent as the text of its cell
        worker = learner.run_code
        member = {**member, "code": learner.code_of(run.pipeline),
                  "function": run.pipeline.__name__}
    label = f"{SHARE} [{o.guarantee}]" + (f" frozen at {o.crash_at}" if o.freeze else "")
    return Workers(worker, [dict(member) for _ in range(o.instances)], label=label)


def _nemesis(o) -> Nemesis:
    """Killed at ``crash_at`` and restarted; or frozen there (SIGSTOP) for its records'
    lock plus FREEZE_MARGIN_S, its connection open, so only the lock expiring frees its
    records, then thawed: its late acknowledgement is refused, it polls again and gets the
    records once more (delivery count 2)."""
    if o.crash_at is None:
        return Nemesis()
    if not o.freeze:
        return Nemesis(CrashAt(o.crash_at, _hit(o), 0))
    frozen_s = _lock_ms(o) / 1000 + FREEZE_MARGIN_S
    return Nemesis(StallAt(o.crash_at, _hit(o), 0), Thaw(0, after(frozen_s, since=Frozen(0))))


def _facts(run) -> dict:
    from labkit.kafka.inspect import Inspector  # the inspector's protocol: only when run
    from labkit.kafka.inspect.share import share_state

    with Inspector(run.bootstrap) as inspector:
        state = share_state(inspector, run.group_id, run.topics["input"])
    frozen_s = None
    if run.o.freeze:
        (stall,), (thaw,) = run.nemesis.of(StallAt), run.nemesis.of(Thaw)
        frozen_s = stall.stalled_s(thaw.thawed_at)
    return {"group": run.group_id, "share_state": state, "frozen_s": frozen_s,
            # the acknowledgements the broker refused, as the consumers' commit_sync
            # reported them (a frozen run's late ACCEPT)
            "refused_acks": [{"consumer": e["instance"], "offsets": e.get("offsets"),
                              "error": err} for e in run.history if e["kind"] == "ack-refused"
                             for err in e["errors"].values()]}


def _summary(run) -> str:
    """The audit's summary plus one stable line for the queue (nbval compares both)."""
    text = (f"{run.report.summary()}\n  archived={run.archived} delivery counts "
            f"(highest per record -> records): {run.delivery_counts}")
    if run.refused_acks:  # only when the broker refused one (a lock that expired)
        errors = sorted({a["error"].split(",")[0].removeprefix("KafkaError{code=")
                         for a in run.refused_acks})
        text += f"\n  acknowledgements refused: {len(run.refused_acks)} ({', '.join(errors)})"
    return text


def _json(run) -> dict:
    """``labkit scenario --json``'s keys, then the queue's own (appended)."""
    return {**run.report.to_dict(), "archived": run.archived,
            "delivery_counts": {str(k): v for k, v in run.delivery_counts.items()},
            "processed_by": run.processed_by, "out_of_order": run.out_of_order,
            "share_state": run.share_state.counts(), "seconds": run.run.total_s,
            "refused_acks": run.refused_acks, "frozen_s": run.frozen_s}


def check_settings(guarantee: str, crash_at: str | None, instances: int, ack_mode: str,
                   poison: str | None, freeze: bool, delivery_limit: int | None,
                   **_: object) -> None:
    """A ValueError that says what to use, before anything is written."""
    if guarantee == "exactly_once":
        raise ValueError(share.NO_EXACTLY_ONCE)
    check_guarantee(guarantee)
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


register(Experiment(
    SHARE, "share consumers take records from one partition; a crash or a freeze redelivers",
    crash_points=crash_points, check=check_settings,
    pipeline="the share consumer's function", options=(
        Option("guarantee", "at_least_once", "at_most_once | at_least_once (a queue has no "
               "exactly-once)", short="-g"),
        Option("crash_at", None, "a crash point (see `labkit crash-points`)"),
        common.records(40),
        Option("instances", 1, "share consumers (processes)", kind=int, minimum=1),
        Option("ack_mode", "explicit", "explicit | implicit acknowledgement",
               ("explicit", "implicit")),
        Option("poison", None, "a poison record, release | reject", ("release", "reject")),
        Option("freeze", False, "freeze (SIGSTOP) the consumer at --crash-at past its record "
               "lock, then thaw it", kind=bool),
        Option("hit", None, "crash on this visit of the point", kind=int, cli=False),
        common.seed(),
        Option("record_lock_ms", None, "this group's record lock", kind=int, cli=False),
        Option("delivery_limit", None, "this group's delivery limit (the broker's: 5)",
               kind=int),
        common.keep_topics(True),
    ),
    workload=_workload,
    clients=_clients,
    nemesis=_nemesis,
    checkers=lambda o: [QueueAudit(SHARE, o.guarantee, o.delivery_limit or share.DELIVERY_LIMIT,
                                   crash_at=o.crash_at)],
    facts=_facts,
    presentation=Presentation(summary=_summary, json=_json)))
