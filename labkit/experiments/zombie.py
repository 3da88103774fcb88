"""The zombie after a rebalance: ctp's exactly-once loop frozen mid-transaction while the
group gives its partition to another instance, then woken to commit (KIP-447's fencing).

    run = experiments.run("zombie-rebalance", fencing="group")
    run = experiments.run("zombie-rebalance", pipeline=my_metadata)  # the learner's line
    run.zombie_error        # what the group coordinator told the woken instance

``pipeline=`` is the learner's function ``(consumer, bootstrap, group_id)`` that returns
the group metadata the offsets carry into the transaction (notebook 06 §5): the one line
that decides whether the woken instance can be fenced. It runs in both instances.

The parts: the input and output topics; instance A of ctp's loop (one batch, then it
stops) as a supervised worker; the nemesis freezes A (SIGSTOP) at its stall point, with
its batch written inside a transaction and its offsets not yet sent (``StallAt``), starts
instance B once A is frozen (``Join`` on ``Frozen``: the group gives B the partition once
A's session times out, and B processes everything, A's batch included), and wakes A up
once B has finished (``Thaw``): A tries to commit its transaction. The audit reads the
output as read_committed.

``fencing="group"``: A's offsets carry its group generation; the broker refuses them
(KIP-447), A aborts, nothing is duplicated. ``fencing="none"``: the offsets carry the group
id only (the pre-KIP-447 pattern); A's commit succeeds and its batch is duplicated.
"""
from __future__ import annotations

from labkit.checking.checks import TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workers, Workload
from labkit.experiments.registry import Experiment, Option, register
from labkit.experiments.scenarios import batch_size
from labkit.faults.nemesis import Nemesis, on
from labkit.faults.process_faults import Frozen, Join, StallAt, Thaw
from labkit.pipelines import ctp, data, learner
from labkit.pipelines.group import GROUP_PROTOCOLS

ZOMBIE = "zombie-rebalance"
FENCING_MODES = ctp.FENCING_MODES
METADATA_ARGS = {"consumer", "bootstrap", "group_id"}  # what the learner's function may ask for
STALL_AT = "in-transaction-before-commit"  # A's batch written, its offsets not yet sent


def _fencing(run) -> str:
    """How the offsets carry the group: the option, or the learner's function's name."""
    return run.pipeline.__name__ if run.pipeline is not None else run.o.fencing


def _member(run, instance: int) -> dict:
    """Instance ``instance``'s settings of ctp's loop (A: 0, B: 1)."""
    o = run.o
    carry = {"fencing": o.fencing} if run.pipeline is None else {  # sent with the offsets
        "metadata_code": learner.code_of(run.pipeline),
        "metadata_function": run.pipeline.__name__}
    return {"input_topic": run.topics["input"],
            "output_topic": run.topics["output"], "group_id": run.group_id,
            "guarantee": o.guarantee, "batch_size": batch_size(o.records),
            "group_protocol": o.group_protocol, "transactional_id": run.transactional_id(instance),
            **carry}


def _clients(run) -> Workers:
    # A stops after its one late batch: the audit then counts what that commit adds
    return Workers(ctp.run, [{**_member(run, 0), "max_batches": 1}],
                   label=f"{ZOMBIE} [{_fencing(run)}]")


def _nemesis(o) -> Nemesis:
    return Nemesis(StallAt(STALL_AT, hit=1, instance=0),
                   Join(Frozen(0), _member, name="a successor takes over"),
                   Thaw(0, on("instance-exited", instance=1, code=0)))


def _facts(run) -> dict:
    (stall,), (wake,) = run.nemesis.of(StallAt), run.nemesis.of(Thaw)
    errors = [e["error"] for e in run.history if e["kind"] == "fenced" and e["instance"] == "0"]
    return {"fencing": _fencing(run),
            # the group coordinator's refusal, None if the commit went through
            "zombie_error": errors[0] if errors else None,
            "stalled_s": stall.stalled_s(wake.thawed_at)}


def _check_metadata(pipeline, o) -> None:
    learner.check_parameters(pipeline, METADATA_ARGS)


def _text(run) -> str:
    return f"{run.summary()}\nzombie told: {run.zombie_error or 'nothing: its commit went through'}"


register(Experiment(
    ZOMBIE, "an instance frozen mid-transaction wakes up after a rebalance: is it fenced?",
    text=_text, check_pipeline=_check_metadata,
    pipeline="the function that gives the group metadata the offsets carry", options=(
        Option("guarantee", "exactly_once", "exactly_once only (zombie fencing)",
               ("exactly_once",), short="-g"),
        Option("fencing", "group", "the offsets carry the group metadata (KIP-447) or the "
               "group id only", FENCING_MODES),
        common.records(40),
        Option("group_protocol", "classic", "classic | consumer (KIP-848)", GROUP_PROTOCOLS),
        common.keep_topics(True),
    ),
    workload=lambda o: Workload("zombie", (Topic("input", loaded=True), Topic("output")),
                                data.generate(o.records)),
    clients=_clients,
    nemesis=_nemesis,
    checkers=lambda o: [TopicAudit(ZOMBIE, o.guarantee, fault="zombie")],  # A stalled, then woke
    facts=_facts,
    presentation=Presentation(json_facts=("fencing", "zombie_error", "stalled_s"))))
