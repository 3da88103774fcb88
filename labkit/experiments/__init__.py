"""The experiments: each combines a pipeline, faults and the audit into one run.

    from labkit import experiments
    run = experiments.run("consume-transform-produce", guarantee="exactly_once",
                          crash_at="after-commit")
    experiments.catalog()            # every experiment, by name (labkit scenario lists them)
    a, b = experiments.run_together(dict(name=..., ...), dict(name=..., ...))  # side by side
    later = experiments.start("...", ...); run = later.result()     # in the background

One module per experiment, each registering itself (``registry.register``); see registry.
"""
from labkit.experiments.registry import catalog, crash_points, run
from labkit.experiments.together import run_together, start

__all__ = ["catalog", "crash_points", "run", "run_together", "start"]
