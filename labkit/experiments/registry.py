"""The one way to run an experiment, and the shape every experiment has.

    from labkit import experiments
    run = experiments.run("consume-transform-produce", guarantee="exactly_once",
                          crash_at="after-commit", pipeline=fee_service)   # the learner's
    run = experiments.run("leader-failover", cluster=lab, acks="1")        # a failure lab's
    print(run.summary()); run.report.verdict; run.timeline(); run.topics

An experiment is a composition of parts, as a Jepsen test is a map (docs/architecture.md,
docs/adding-an-experiment.md): its **options** declared once (``Option``: type, default,
help, choices, bounds; the CLI's flags and the input checks both come from them), a
**workload** (names, topics, inputs: ``labkit.experiments.parts.Workload``), its
**clients** (the pipeline under test, the learner's function or the lab's), a **nemesis**
(fault objects: ``labkit.faults.nemesis``) and its **checkers** (``labkit.checking.checks``).
``run`` checks the options before anything starts, finds or starts the cluster, and runs
the phases under the watchdog (``labkit.faults.watchdog.watched``): the workload prepared,
the clients run under the nemesis (set up before, torn down after, whatever happens), the
checkers composed into the one audit, the run's topics and files cleaned up. Every
experiment returns the same record (``labkit.checking.record.RunRecord``).
``labkit scenario`` and its help are built from the same registry (``catalog``).
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable

from labkit.checking.audit import AuditReport
from labkit.checking.checks import Checker, compose
from labkit.checking.record import PLAIN, Presentation, RunRecord
from labkit.experiments.context import RunContext, options_view
from labkit.experiments.db import Db, owned
from labkit.experiments.options import REQUIRED, Option  # noqa: F401 (experiments import them here)
from labkit.experiments.parts import Workload, prepare
from labkit.faults.nemesis import Nemesis
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


@dataclass(frozen=True)
class Experiment:
    name: str
    help: str  # one line: what it shows
    options: tuple[Option, ...] = ()
    where: str = LAB
    stall_after: float = STALL_S  # the watchdog's default: no progress this long stops the run
    pipeline: str = ""  # what ``pipeline=`` replaces, in words ("" takes none)
    check: Callable[..., None] | None = None  # checks the options together, before anything starts
    # checks the learner's function against the options (``check_pipeline(pipeline, o)``),
    # before anything starts: what it may name, what it cannot be combined with
    check_pipeline: Callable[[Callable, Any], None] | None = None
    text: Callable[[Any], str] = field(default=lambda run: run.summary())  # for the terminal
    group: str = "Kafka"  # the engine: the CLI's help lists experiments by it
    # the crash points its code passes, for a guarantee or for any (None: it takes no crash_at)
    crash_points: Callable[..., tuple[str, ...]] | None = None
    # a failure lab whose links can be cut (labkit.faults.partition: lab.isolate, lab.heal)
    partitions: bool = False
    # The parts, each made from the run's options (``o``: attributes) or the run itself.
    workload: Callable[[Any], Workload] | None = None  # workload(o)
    clients: Callable[[RunContext], Callable[[RunContext], Any]] | None = None  # clients(run)
    nemesis: Callable[[Any], Nemesis] | None = None  # nemesis(o)
    # the system beside Kafka (PostgreSQL, a Connect worker): set up before the clients,
    # torn down after the checkers (labkit.experiments.db)
    db: Callable[[Any], Db] | None = None  # db(o)
    checkers: Callable[[Any], Sequence[Checker]] | None = None  # checkers(o)
    facts: Callable[[RunContext], dict] | None = None  # what the run found, besides the audit
    presentation: Presentation = PLAIN  # its summary and JSON, when not the audit's
    about: str = ""  # more help for its command, after the line of ``help``
    # why a run's fault missed its window (a starved machine stretched it), or None: such a
    # run is made again on new topics, ``attempts`` runs at most (the fact ``attempts``)
    missed: Callable[[RunContext], str | None] | None = None
    attempts: int = 1
    # where=OWN_BROKER: the settings of the broker started for the run, from its options
    broker: Callable[[Any], dict] | None = None
    # the facts that are functions of the run's history alone (the judge's findings):
    # ``labkit check`` computes them again on a stored run (labkit.experiments.recheck)
    history_facts: Callable[[list[dict]], dict] | None = None

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
            known[name].checked(self.name, value)
        if self.check is not None:
            self.check(**values)
        return values


_REGISTRY: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add ``experiment`` to the catalog (an experiment module calls this once, at import)."""
    if experiment.where not in WHERE:
        raise ValueError(f"{experiment.name}: where must be one of {', '.join(WHERE)}")
    if _REGISTRY.get(experiment.name, experiment) != experiment:
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
        announce: Callable[[str], None] = print, **options: Any) -> RunRecord:
    """Run experiment ``name`` with ``options`` (see ``catalog()[name].options``) and return
    its record. ``pipeline``: the learner's function in place of the lab's reference pipeline
    (its cell's text is what the workers run). ``cluster``: the lab to use (a bootstrap
    string or a LocalCluster; for a failure-lab experiment, the ``failure_lab()`` to break;
    default: the lab cluster, or a failure lab started for this run and stopped after it).
    ``stall_after``: seconds without progress before the watchdog stops it (default: the
    experiment's own)."""
    experiment = get(name)
    values = experiment.resolve(options)
    if pipeline is not None and not experiment.pipeline:
        raise ValueError(f"{name} runs a fixed pipeline: it takes no pipeline=")
    if pipeline is not None and experiment.check_pipeline is not None:
        experiment.check_pipeline(pipeline, options_view(values))
    stall_s = experiment.stall_after if stall_after is None else stall_after
    if stall_s <= 0:
        raise ValueError(f"stall_after must be a positive number of seconds, not {stall_after!r}")
    with _context(experiment, cluster, announce, values) as (bootstrap, lab):
        context = RunContext(name, values, bootstrap=bootstrap, cluster=lab, pipeline=pipeline,
                             watch=watch, announce=announce)
        stop = lab.kill if experiment.where != LAB else None
        return watched(name, stall_s, lambda: perform(experiment, context), stop=stop)


def perform(experiment: Experiment, run: RunContext) -> RunRecord:
    """The phases, for every experiment: the workload prepared, the clients run under the
    nemesis (torn down always), the checkers composed, the run's topics and files cleaned
    up (always), one record."""
    failed = True
    try:
        report = _phases(experiment, run)
        failed = False
    finally:
        run.close(failed)
    # the topics' names, by role, also when deleted (keep_topics says whether they are
    # there); an experiment may say more of them (torture: whether kept)
    facts = dict(run.facts)
    topics = facts.pop("topics", None) or dict(run.topics)
    return RunRecord(experiment.name, report, topics=topics,
                     history=run.history, steps=run.steps, faults=run.fired_faults,
                     facts=facts, options=run.options, inputs=run.inputs,
                     presentation=experiment.presentation, release=run.discard)


def _phases(experiment: Experiment, run: RunContext) -> AuditReport:
    missing = [part for part in ("workload", "clients", "checkers")
               if getattr(experiment, part) is None]
    if missing:
        raise TypeError(f"{experiment.name} lacks its {', '.join(missing)}")
    for attempt in range(1, experiment.attempts + 1):
        prepare(run, experiment.workload(run.o))
        if experiment.db is not None:
            owned(run, experiment.db(run.o))
        clients = run.clients = experiment.clients(run)
        if hasattr(clients, "attach"):
            clients.attach(run)  # e.g. a pool the nemesis arms a crash point in
        if experiment.nemesis is not None:
            run.nemesis = experiment.nemesis(run.o)
        with run.nemesis.active(run):
            clients(run)
        missed = experiment.missed(run) if experiment.missed is not None else None
        if missed is None or attempt == experiment.attempts:
            break
        run.step(f"{missed}: the experiment is run again ({attempt} of {experiment.attempts})")
        run.again()
    if experiment.attempts > 1:
        run.observe(attempts=attempt)
    report, counted = compose(run, experiment.checkers(run.o))
    run.observe(**counted)
    if experiment.facts is not None:
        run.observe(**experiment.facts(run))
    return report


@contextmanager
def _context(experiment: Experiment, cluster: Any, announce: Callable[[str], None],
             options: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    """The experiment's cluster: the one given, the lab's, or a failure lab or a broker of
    its own for this run."""
    if experiment.where == OWN_BROKER:
        from labkit.kafka.localcluster import private_cluster

        announce("This experiment changes a broker setting, so it starts a Kafka of its own "
                 "on this machine (one broker), whatever cluster your other lessons use.")
        properties = experiment.broker(SimpleNamespace(**options)) if experiment.broker else {}
        with private_cluster(f"{experiment.name}-", properties=properties) as lab:
            yield lab.bootstrap, lab
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
                yield lab.bootstrap, lab
            return
        yield cluster.bootstrap, cluster
        return
    if cluster is None:
        from labkit.kafka import cluster as lab, names

        names.namespace()  # a bad LABKIT_NAMESPACE fails here, before a broker is started
        running = lab.ensure()
        yield running.bootstrap, running
        return
    if isinstance(cluster, str):
        yield cluster, None
        return
    yield cluster.bootstrap, cluster
