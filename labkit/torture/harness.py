"""The torture harness from Python: any app in the lab, killed at random, its output audited.

    result = torture(["python", "examples/torture/exactly_once_app.py"], records=400, kills=3)
    result.verdict        # 'exactly once'
    result.to_json()      # the audit keys of `labkit scenario --json`, kills, restarts, ...

It is the registered experiment ``torture`` (``labkit.experiments.torture``: the contract,
the app's supervision, the seeded schedule of kills, the audit, and every option, declared
there once: ``labkit torture --help`` lists them); ``labkit torture`` on the command line is
the same experiment.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.checking.record import RunRecord
from labkit.experiments import registry
from labkit.kafka import cluster as lab
from labkit.pipelines.contract import HarnessError


def torture(command: Sequence[str], *, cluster: lab.Cluster | None = None,
            **options: Any) -> RunRecord:
    """Run ``command`` as the pipeline under test with the experiment's ``options``
    (``records``, ``kills``, ``seed``, ``kill_after``, ``timeout``, ...: docs/torture.md)
    and audit its output. Raises HarnessError when the run cannot be judged (an option it
    refused among them)."""
    try:
        return registry.run("torture", command=list(command or ()), cluster=cluster, **options)
    except ValueError as exc:  # an option the registry refused: the harness's error
        if isinstance(exc, HarnessError):
            raise
        raise HarnessError(str(exc)) from None
