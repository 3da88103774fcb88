"""The judge's coordinator phase: the loop as the judge runs it (``labkit.experiments.judge``:
its instances in one group, the input arriving while they work, the audit and the findings)
while the broker that coordinates its transactions is SIGKILLed and started again, on a
failure lab of three brokers of its own.

    run = experiments.run("judge-coordinator", pipeline=my_loop)   # a failure lab for the run
    run = experiments.run("judge-coordinator", cluster=lab, kills=2)

Each kill hits the transaction coordinator of a running instance's transactional.id, as the
cluster says it is when the kill comes (``labkit.kafka.coordinators``), a seeded 1-2 s
after the loop's next commit. The clients find the next coordinator, which loaded the
transactions from the replicated ``__transaction_state``; a client call that blocks past
its timeout meanwhile (librdkafka #5456, #5511, when the group's coordinator was on that
broker too) is the stall supervision's to restart (``labkit.experiments.app_run``).
"""
from __future__ import annotations

from labkit.experiments import judge, judge_findings as findings
from labkit.experiments.registry import FAILURE_LAB, Experiment, Option, register
from labkit.faults.broker_faults import KillBroker
from labkit.faults.nemesis import Nemesis
from labkit.faults.process_faults import any_running
from labkit.faults.production import BETWEEN_S
from labkit.faults.schedule import Schedule
from labkit.faults.wire_faults import ProxyFault
from labkit.kafka.coordinators import transaction_coordinator

NAME = "judge-coordinator"


def coordinator_of(seed: int):
    """A function of the run: the broker coordinating a running instance's transactions."""
    pick = any_running(seed)

    def broker(run) -> int:
        instance = pick(run)
        return transaction_coordinator(
            run.cluster, run.workers.instances[instance].kwargs["transactional_id"])
    return broker


def _nemesis(o) -> Nemesis:
    kills = [KillBroker(coordinator_of(o.seed + n), restart=True,
                        name="the transaction coordinator's broker SIGKILLed")
             for n in range(o.kills)]
    return Nemesis(ProxyFault(to_history=True, trace_apis=findings.LEDGER_APIS), Schedule(
        kills, BETWEEN_S, seed=o.seed, clock="commit", name=judge.PHASES[o.phase],
        offsets_committed=lambda run: run.progress.sample(fresh=True)[0]))


register(Experiment(
    NAME, "a consume-transform-produce loop as the judge runs it while its transaction "
    "coordinator's broker is SIGKILLed (a failure lab of three brokers)", stall_after=600.0,
    where=FAILURE_LAB, options=(
        Option("phase", "coordinator", "the judge's phase this is", ("coordinator",),
               cli=False),
        Option("kills", 2, "the coordinator's broker SIGKILLed this often (each restarted)",
               kind=int, minimum=1),
        *judge.COMMON),
    nemesis=_nemesis, **judge.PARTS))
