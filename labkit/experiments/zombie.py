"""The zombie after a rebalance: ctp's exactly-once loop frozen mid-transaction while the
group gives its partition to another instance, then woken to commit (KIP-447's fencing).

    run = experiments.run("zombie-rebalance", fencing="group")   # -> ZombieRun
    run = experiments.run("zombie-rebalance", pipeline=my_metadata)  # the learner's line
    run.zombie_error        # what the group coordinator told the woken instance

``pipeline=`` is the learner's function ``(consumer, bootstrap, group_id)`` that returns
the group metadata the offsets carry into the transaction (notebook 06 §5): the one line
that decides whether the woken instance can be fenced. It runs in both instances.
"""
from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from labkit.checking import audit, history, timeline
from labkit.checking.audit import AuditReport
from labkit.experiments.registry import Experiment, Option, register
from labkit.experiments.scenarios import batch_size, check_records
from labkit.faults.runner import run_zombie
from labkit.kafka import names as namespace
from labkit.kafka import topics
from labkit.paths import lab_home
from labkit.pipelines import ctp, data, learner
from labkit.pipelines.group import GROUP_PROTOCOLS, check_group_protocol

ZOMBIE = "zombie-rebalance"
FENCING_MODES = ctp.FENCING_MODES
METADATA_ARGS = {"consumer", "bootstrap", "group_id"}  # what the learner's function may ask for


@dataclass
class ZombieRun:
    """The zombie-after-rebalance experiment: the audit, and what the zombie was told."""

    report: AuditReport
    fencing: str
    zombie_error: str | None  # the group coordinator's refusal, None if the commit went through
    stalled_s: float
    history: list[dict] = field(default_factory=list, repr=False)
    topics: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        return self.report.summary()

    def to_json(self) -> str:
        return json.dumps({**self.report.to_dict(), "fencing": self.fencing,
                           "zombie_error": self.zombie_error, "stalled_s": self.stalled_s})

    def timeline(self) -> str:
        return timeline.text(self.history)


def zombie_rebalance(bootstrap: str, guarantee: str = "exactly_once", fencing: str = "group",
                     records: int = 40, group_protocol: str = "classic",
                     keep_topics: bool = True, metadata: Callable | None = None) -> ZombieRun:
    """Instance A reads a batch and writes its output inside a transaction, then freezes
    (SIGSTOP) before sending its offsets. B joins; once A's session times out the group gives
    B the partition, and B processes everything, A's batch included. Then A wakes up and
    tries to commit its transaction.

    ``fencing="group"``: A's offsets carry its group generation; the broker refuses them
    (KIP-447), A aborts, nothing is duplicated. ``fencing="none"``: the offsets carry the
    group id only (the pre-KIP-447 pattern); A's commit succeeds and its batch is duplicated.
    ``keep_topics=False`` deletes its topics at the end. ``metadata``: the learner's
    function in place of ``fencing`` (its name is the run's ``fencing``).
    """
    if guarantee != "exactly_once":
        raise ValueError(f"{ZOMBIE} is an exactly_once experiment (zombie fencing); "
                         f"not {guarantee!r}")
    if fencing not in FENCING_MODES:
        raise ValueError(f"unknown fencing {fencing!r}; choose one of {', '.join(FENCING_MODES)}")
    check_group_protocol(group_protocol)
    check_records(records)
    offsets_carry = {"fencing": fencing}  # what ctp.run sends with the offsets
    if metadata is not None:
        learner.check_parameters(metadata, METADATA_ARGS)
        offsets_carry = {"metadata_code": learner.code_of(metadata),
                         "metadata_function": metadata.__name__}
        fencing = metadata.__name__
    base = namespace.qualify(f"zombie-{fencing}-{uuid.uuid4().hex[:8]}")  # as in scenarios.run_detailed
    names_ = {"input": f"{base}-in", "output": f"{base}-out"}
    workdir = lab_home() / "runs" / base
    workdir.mkdir(parents=True, exist_ok=True)
    inputs = data.generate(records)
    common = {"bootstrap": bootstrap, "input_topic": names_["input"],
              "output_topic": names_["output"], "group_id": base, "guarantee": guarantee,
              "batch_size": batch_size(records), "group_protocol": group_protocol,
              **offsets_carry}
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
    return ZombieRun(report, fencing, errors[0] if errors else None, outcome.stalled_s, events,
                     names_)


def _run(context, **options) -> ZombieRun:
    return zombie_rebalance(context.bootstrap, **options, metadata=context.pipeline)


def _text(run: ZombieRun) -> str:
    return f"{run.summary()}\nzombie told: {run.zombie_error or 'nothing: its commit went through'}"


register(Experiment(
    ZOMBIE, "an instance frozen mid-transaction wakes up after a rebalance: is it fenced?",
    _run, where="lab", text=_text,
    pipeline="the function that gives the group metadata the offsets carry", options=(
        Option("guarantee", "exactly_once", "exactly_once only (zombie fencing)",
               ("exactly_once",), short="-g"),
        Option("fencing", "group", "the offsets carry the group metadata (KIP-447) or the "
               "group id only", FENCING_MODES),
        Option("records", 40, "how many input records", kind=int, short="-n"),
        Option("group_protocol", "classic", "classic | consumer (KIP-848)", GROUP_PROTOCOLS),
        Option("keep_topics", True, "keep the run's topics", kind=bool, cli_default=False),
    )))
