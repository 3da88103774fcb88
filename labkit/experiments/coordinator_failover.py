"""When the transaction coordinator fails: an exactly-once loop still delivers each record once.

    run = experiments.run("coordinator-failover")                  # on a failure lab of its own
    run = experiments.run("coordinator-failover", cluster=lab,     # on one you hold, with
                          pipeline=copy_fees)                      # the learner's loop (05b)
    run.report.lost, run.report.duplicated   # 0, 0
    run.coordinators                         # the coordinator's broker: at the start, after each kill

The consume-transform-produce loop of notebook 05, in plain confluent-kafka
(``labkit.pipelines.fee_loop.copy_fees``), reads an input partition and writes the fees of
each batch of 10 in one transaction, with its input offsets. Its transaction coordinator
(the broker leading the ``__transaction_state`` partition of its transactional.id) is
SIGKILLed twice:

1. **mid-transaction**: batch 2's records and offsets are sent, ``commit_transaction`` not
   yet called. The app calls it anyway: the client finds the new coordinator, which loaded
   the transaction from the replicated ``__transaction_state``.
2. **between EndTxn and the markers**: the leader of the data partitions is frozen
   (SIGSTOP) so no COMMIT marker can be written; ``commit_transaction`` for batch 4 returns
   (the coordinator logged its decision, PrepareCommit); then the coordinator is killed
   and the leader thawed. The next coordinator finds the decision and writes the markers.
   A window that does not hold (the batch aborted, or the freeze's timer had to end it:
   the coordinator needed the frozen broker in its ISR) moves the kill to the next batch.

The data partitions, and the consumer group's coordinator, are on a broker that is never
the transaction coordinator, so only the transaction coordinator fails. The audit
(``labkit.checking.audit``) reads the output read_committed and read_uncommitted: lost,
duplicated, aborted records visible.
"""
from __future__ import annotations

from typing import Any

from labkit.checking.checks import TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.context import RunContext
from labkit.experiments.failover import BROKERS
from labkit.experiments.parts import Workload
from labkit.experiments.registry import FAILURE_LAB, Experiment, register
from labkit.faults.broker_faults import FreezeBroker, KillBroker, RestartBroker, ThawBroker
from labkit.faults.nemesis import Nemesis, Observe, Until, WaitUntil, at_least, on
from labkit.kafka.coordinators import (group_coordinated_by, next_coordinator,
                                       transaction_coordinator, transaction_state_partition)
from labkit.pipelines import data
from labkit.pipelines.fee_loop import BATCH, FeeLoop, markers_written

SCENARIO = "coordinator-failover"
KILL_MID_TRANSACTION, KILL_AFTER_END_TXN = 2, 4  # the batches (from 1) whose coordinator dies
FREEZE_LIMIT_S = 20  # a commit needs ~5 s with the leader frozen (4 s to leave the ISR)
QUIET = {"log_level": 2}  # the clients' only log lines here: refused connections to the
# brokers this run kills; what matters comes back as exceptions from the transaction calls


def placed(run: RunContext) -> FeeLoop:
    """The loop's client, its transactional.id registered first so that the topics go where
    the faults need them: their leader (and the consumer group's coordinator) a broker that
    is neither the transaction coordinator nor the one that takes over from it."""
    lab, tid = run.cluster, run.transactional_id()
    lab.restart()  # every broker up, whatever a previous run left
    client = FeeLoop(producer_settings=QUIET, consumer_settings=QUIET)
    client.open(run)  # the coordinator exists from here on
    first = transaction_coordinator(lab, tid)
    leader = next(b for b in BROKERS if b not in (first, next_coordinator(lab, tid, first)))
    assignment = [[leader, *(b for b in BROKERS if b != leader)]]
    run.create_topic("output", replica_assignment=assignment)
    data.load_into_topic(run.bootstrap, run.create_topic("input", replica_assignment=assignment),
                         run.inputs)
    # Only the transaction coordinator fails here. (With the group's coordinator killed and
    # restarted as well, send_offsets_to_transaction was seen to wait for minutes under load.)
    client.group_id = group_coordinated_by(lab, leader, run.base)
    run.observe(coordinators=[first], coordinator=first, leader=leader)
    run.step(f"{len(run.inputs)} inputs written; transaction coordinator: broker {first}; "
             f"the topics' leader: broker {leader}")
    return client


def coordinator(run: Any) -> int:
    return run.facts["coordinator"]


def leader(run: Any) -> int:
    return run.facts["leader"]


def moved(kill: KillBroker):
    """Where the coordinator went after ``kill``'s kill (an observation)."""
    def look(run: Any) -> dict:
        new = transaction_coordinator(run.cluster, run.transactional_id(), not_on=kill.killed[-1])
        return {"coordinators": [*run.facts["coordinators"], new], "coordinator": new}
    return look


def missed(told: dict) -> str:
    late = (f" only after the freeze ended ({FREEZE_LIMIT_S} s): its coordinator needed the "
            "frozen broker in its ISR") if told["expired"] else ""
    return f"batch {told['batch']}: {told['outcome']}{late}; the kill waits for the next batch"


def nemesis(o: Any) -> Nemesis:
    first = KillBroker(coordinator, on("before-commit", batch=KILL_MID_TRANSACTION),
                       says="batch {batch}: records and offsets sent; coordinator (broker "
                            "{broker}) SIGKILLed before commit_transaction")
    after_first = lambda run: bool(first.killed)  # noqa: E731
    later = at_least(KILL_AFTER_END_TXN)
    freeze = FreezeBroker(
        leader, on("before-commit", batch=later), thaw_after_s=FREEZE_LIMIT_S, repeat=True,
        when=lambda run: not second.killed and coordinator(run) != leader(run),
        # Every replica of the id's partition in sync first, as its coordinator sees it:
        # freezing the leader takes one replica out of that ISR, and below min.isr 2 the
        # coordinator cannot log its decision until the thaw.
        ready=lambda run: transaction_state_partition(run.cluster, run.transactional_id(),
                                                      ask=coordinator(run)),
        says="batch {batch}: topics' leader (broker {broker}) frozen: no marker can be written")
    second = KillBroker(coordinator, on("batch-ended", batch=later, committed=True),
                        when=lambda run: freeze.still_frozen(),
                        says="batch {batch}: commit_transaction returned; coordinator (broker "
                             "{broker}) SIGKILLed before it could write the markers")
    after_second = lambda run: bool(second.killed)  # noqa: E731
    markers = Until(lambda run: markers_written(run.bootstrap, run.topics["output"]),
                    "the COMMIT markers of the batch committed before the kill", 90)
    return Nemesis(
        first,
        Observe(on("batch-ended", batch=KILL_MID_TRANSACTION), moved(first), when=after_first),
        RestartBroker(on("batch-ended", batch=KILL_MID_TRANSACTION),  # three brokers again
                      broker=lambda run: first.killed[-1], when=after_first,
                      says="batch {batch}: {outcome} through the new coordinator, broker "
                           "{coordinator}; broker {broker} restarted"),
        second, freeze,  # torn down in reverse: the leader thawed before brokers restart
        ThawBroker(on("batch-ended", batch=later), freeze=freeze, when=after_second),
        Observe(on("batch-ended", batch=later), moved(second), when=after_second,
                says="the new coordinator, broker {coordinator}, completes the commit"),
        WaitUntil(on("batch-ended", batch=later), markers, when=after_second,
                  says="batch {batch}: its COMMIT marker is in the output (LSO = high watermark)"),
        ThawBroker(on("batch-ended", batch=later), freeze=freeze, says=missed, repeat=True,
                   when=lambda run: not second.killed and (freeze.active or freeze.expired)))


register(Experiment(
    SCENARIO, "the transaction coordinator SIGKILLed twice under an exactly-once loop",
    where=FAILURE_LAB, pipeline="the loop (as copy_fees)",
    options=(common.records(60, minimum=BATCH * (KILL_AFTER_END_TXN + 1),
                     why=f"batches of {BATCH}, the second kill at batch {KILL_AFTER_END_TXN}"),),
    workload=lambda o: Workload(SCENARIO, inputs=data.generate(o.records, prefix="c")),
    clients=placed, nemesis=nemesis,
    checkers=lambda o: [TopicAudit(SCENARIO, "exactly_once", fault="coordinator SIGKILLed twice")],
    presentation=Presentation(json=lambda run: {
        **run.report.to_dict(), "coordinators": run.coordinators, "errors": run.errors,
        "timeline": run.timeline().splitlines()})))
