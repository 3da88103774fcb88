"""The one way to run an experiment: a pipeline, its faults and the audit, by name.

    from labkit import experiments
    run = experiments.run("consume-transform-produce", guarantee="exactly_once",
                          crash_at="after-commit", pipeline=fee_service)   # the learner's
    run = experiments.run("leader-failover", cluster=lab, acks="1")        # a failure lab's
    print(run.summary()); run.report.verdict; run.timeline(); run.topics

Each experiment module registers itself once (``register``): its name, a line of help, its
options with their defaults, where it runs (the lab cluster, a failure lab of its own, a
broker of its own) and how long it may go without progress. ``run`` checks the options
before anything starts, finds or starts the cluster, and runs the experiment under the
watchdog (``labkit.faults.watchdog.watched``): no step for ``stall_s`` stops every process
it started and raises ExperimentStalled naming its last step. ``labkit scenario`` and its
help are built from the same registry (``catalog``).
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from labkit.faults.watchdog import watched

LAB, FAILURE_LAB, OWN_BROKER = "lab", "failure-lab", "own-broker"
WHERE = {LAB: "on the lab cluster (or LABKIT_BOOTSTRAP's)",
         FAILURE_LAB: "on a failure lab of its own (a controller and brokers 1-3)",
         OWN_BROKER: "on a broker of its own (its settings are the broker's)"}
STALL_S = 120.0  # longer than any bounded wait of an experiment's steps (60-90 s)


@runtime_checkable
class Run(Protocol):
    """What every experiment returns: the audit, the timeline, the history, the topics."""

    report: Any  # labkit.checking.audit.AuditReport: the one verdict
    topics: Mapping[str, str]  # the run's topics, by role ("input", "output", ...)
    history: Sequence[dict]  # the workers' events (labkit.checking.history)

    def summary(self) -> str: ...

    def to_json(self) -> str: ...

    def timeline(self) -> str: ...


REQUIRED = object()  # an option's default: the caller must choose


class RunBasics:
    """The parts of ``Run`` an experiment's run class may leave out: its summary is the
    audit's, its timeline its ``steps`` (seconds, what), no topics kept, no workers' history."""

    topics: Mapping[str, str] = MappingProxyType({})
    history: Sequence[dict] = ()

    def summary(self) -> str:
        return self.report.summary()  # type: ignore[attr-defined]

    def timeline(self) -> str:
        steps = getattr(self, "steps", ())
        return "\n".join(f"{t:5.1f} s  {what}" for t, what, *_ in steps)


@dataclass(frozen=True)
class Option:
    """One setting of an experiment: its Python name, default and help. The CLI's flag is
    the name with dashes (a bool: a --name/--no-name switch); ``cli=False`` for data only
    Python can give (a list of records, a dict); ``cli_default`` where the terminal's
    default differs (topics are kept for a notebook's next cells, deleted by the CLI)."""

    name: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    kind: type = str
    cli: bool = True
    cli_default: Any = REQUIRED
    short: str = ""  # e.g. "-g"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass
class Context:
    """Where an experiment runs and what the caller gave it besides its options."""

    bootstrap: str | None = None
    cluster: Any = None  # the failure lab (labkit.kafka.cluster.LocalCluster), if any
    pipeline: Callable | None = None  # the learner's function, or None: the reference one
    watch: Callable | None = None  # a live view (a dashboard factory, a ReplicaBoard)
    announce: Callable[[str], None] = print


@dataclass(frozen=True)
class Experiment:
    name: str
    help: str  # one line: what it shows
    body: Callable[..., Run]  # body(context, **options)
    options: tuple[Option, ...] = ()
    where: str = LAB
    stall_s: float = STALL_S
    pipeline: str = ""  # what ``pipeline=`` replaces, in words ("" takes none)
    check: Callable[..., None] | None = None  # checks the options before anything starts
    text: Callable[[Any], str] = field(default=lambda run: run.summary())  # for the terminal
    group: str = "Kafka"  # the CLI's help lists experiments by group
    # the crash points its code passes, for a guarantee or for any (None: it takes no crash_at)
    crash_points: Callable[..., tuple[str, ...]] | None = None
    # a failure lab whose links can be cut (labkit.faults.partition: lab.isolate, lab.heal)
    partitions: bool = False

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Every option's value: the given ones checked by name and choice, defaults else."""
        known = {o.name: o for o in self.options}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ValueError(f"{self.name} takes no option {', '.join(unknown)}; its options: "
                             f"{', '.join(known) or 'none'}")
        values = {name: given.get(name, o.default) for name, o in known.items()}
        missing = [known[n] for n, v in values.items() if v is REQUIRED]
        if missing:
            o = missing[0]
            if o.kind is bool:
                raise ValueError(f"{self.name}: choose {o.flag} or --no-{o.flag[2:]}")
            raise ValueError(f"{self.name} needs {o.flag} {' | '.join(o.choices) or o.name}")
        for name, value in values.items():
            choices = known[name].choices
            if choices and value is not None and str(value) not in choices:
                raise ValueError(f"{self.name}: {name} must be one of {', '.join(choices)}, "
                                 f"not {value!r}")
        if self.check is not None:
            self.check(**values)
        return values


_REGISTRY: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add ``experiment`` to the catalog (an experiment module calls this once, at import)."""
    if experiment.where not in WHERE:
        raise ValueError(f"{experiment.name}: where must be one of {', '.join(WHERE)}")
    if _REGISTRY.get(experiment.name, experiment).body is not experiment.body:
        raise ValueError(f"two experiments are named {experiment.name!r}")
    _REGISTRY[experiment.name] = experiment
    return experiment


def catalog() -> dict[str, Experiment]:
    """Every registered experiment by name: each module of labkit.experiments is imported
    once, so a new experiment is one new module that calls ``register``."""
    import labkit.experiments as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    return dict(_REGISTRY)


def get(name: str) -> Experiment:
    experiments = catalog()
    if name not in experiments:
        raise ValueError(f"unknown experiment {name!r}. Valid experiments: "
                         f"{', '.join(experiments)}")
    return experiments[name]


def crash_points(name: str, guarantee: str | None = None) -> tuple[str, ...]:
    """The crash points experiment ``name``'s code passes (for ``guarantee``, or for any)."""
    experiment = get(name)
    return experiment.crash_points(guarantee) if experiment.crash_points else ()


def run(name: str, *, pipeline: Callable | None = None, cluster: Any = None,
        watch: Callable | None = None, stall_after: float | None = None,
        announce: Callable[[str], None] = print, **options: Any) -> Run:
    """Run experiment ``name`` with ``options`` (see ``catalog()[name].options``) and return
    its run. ``pipeline``: the learner's function in place of the lab's reference pipeline
    (its cell's text is what the workers run). ``cluster``: the lab to use (a bootstrap
    string or a LocalCluster; for a failure-lab experiment, the ``failure_lab()`` to break;
    default: the lab cluster, or a failure lab started for this run and stopped after it).
    ``stall_after``: seconds without progress before the watchdog stops it (default: the
    experiment's own)."""
    experiment = get(name)
    values = experiment.resolve(options)
    if pipeline is not None and not experiment.pipeline:
        raise ValueError(f"{name} runs a fixed pipeline: it takes no pipeline=")
    stall_s = experiment.stall_s if stall_after is None else stall_after
    if stall_s <= 0:
        raise ValueError(f"stall_after must be a positive number of seconds, not {stall_after!r}")
    with _context(experiment, cluster, announce) as context:
        context.pipeline, context.watch = pipeline, watch
        stop = context.cluster.kill if experiment.where == FAILURE_LAB else None
        return watched(name, stall_s, lambda: experiment.body(context, **values), stop=stop)


@contextmanager
def _context(experiment: Experiment, cluster: Any,
             announce: Callable[[str], None]) -> Iterator[Context]:
    """The experiment's cluster: the one given, the lab's, or a failure lab for this run."""
    if experiment.where == OWN_BROKER:
        yield Context(announce=announce)
        return
    if experiment.where == FAILURE_LAB:
        if cluster is not None and not hasattr(cluster, "kill"):
            raise ValueError(f"{experiment.name} breaks brokers: give it a failure lab "
                             "(labkit.kafka.failure_lab.failure_lab()), not a bootstrap")
        if (experiment.partitions and cluster is not None
                and getattr(cluster, "network", None) is None):
            raise ValueError(f"{experiment.name} cuts the network between brokers: give it "
                             "failure_lab(network=labkit.faults.partition.Network())")
        if cluster is None:
            from labkit.faults.partition import Network
            from labkit.kafka.failure_lab import failure_lab

            network = Network() if experiment.partitions else None
            with failure_lab(announce=announce, network=network) as lab:
                yield Context(lab.bootstrap, lab, announce=announce)
            return
        yield Context(cluster.bootstrap, cluster, announce=announce)
        return
    if cluster is None:
        from labkit.kafka import cluster as lab, names

        names.namespace()  # a bad LABKIT_NAMESPACE fails here, before a broker is started
        bootstrap = lab.ensure().bootstrap
    else:
        bootstrap = cluster if isinstance(cluster, str) else cluster.bootstrap
    yield Context(bootstrap, announce=announce)

