"""The torture harness from Python: any app in the lab, killed at random, its output audited.

    result = torture(["python", "examples/torture/exactly_once_app.py"], input=400, kills=3)
    result.verdict        # 'exactly once'
    result.to_json()      # the audit keys of `labkit scenario --json`, kills, restarts, ...

It is the registered experiment ``torture`` (``labkit.experiments.torture``: the contract,
the app's supervision, the seeded schedule of kills, the audit), run with the names this
function has always taken; ``labkit torture`` on the command line is the same experiment.
"""
from __future__ import annotations

from collections.abc import Sequence

from labkit.checking.record import RunRecord
from labkit.experiments import registry
from labkit.experiments.app_run import STALL_S
from labkit.kafka import cluster as lab
from labkit.pipelines.contract import HarnessError


def torture(command: Sequence[str], *, input: int = 200, kills: int = 3, seed: int = 0,
            broker_kills: int = 0, timeout_s: float = 120.0, check: str = "records",
            kill_after_s: tuple[float, float] = (1.0, 4.0), fault: str | None = None,
            cluster: lab.Cluster | None = None, partitions: int = 1,
            keep_topics: bool = False, kill_clock: str = "start",
            plaintext: bool = False, stall_s: float = STALL_S, instances: int = 1,
            schedule: str = "random") -> RunRecord:
    """Run ``command`` as the pipeline under test, kill it ``kills`` times (each a seeded
    random ``kill_after_s`` after the previous fault) and ``broker_kills`` times its broker
    (a local lab), and audit its output (docs/torture.md has the contract and every option);
    ``schedule="production"``: under the judge's faults besides (or one kind of them).
    Raises HarnessError when the run cannot be judged."""
    try:
        return registry.run("torture", command=list(command or ()), input=input, kills=kills,
                            seed=seed, broker_kills=broker_kills, timeout=timeout_s,
                            check=check, kill_after=tuple(kill_after_s), fault=fault,
                            cluster=cluster, partitions=partitions, keep_topics=keep_topics,
                            kill_clock=kill_clock, plaintext=plaintext, stall_s=stall_s,
                            instances=instances, schedule=schedule)
    except ValueError as exc:  # an option the registry refused: the harness's error
        if isinstance(exc, HarnessError):
            raise
        raise HarnessError(str(exc)) from None
