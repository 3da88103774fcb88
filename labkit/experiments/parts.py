"""The parts an experiment is composed of, besides its nemesis (labkit.faults) and its
checkers (labkit.checking.checks): its workload and its clients.

- ``Workload``: the run's names (a stem), its topics (roles, partitions, settings; the
  input loaded with the run's records) and those records, which the audit checks against.
- clients: a callable ``clients(run)`` that runs the pipeline under test to its end,
  reporting its steps (``run.step``) and the events faults wait for (``run.event``).
  ``Workers`` are the common kind: N instances of a worker function as supervised child
  processes (``labkit.faults.pool.WorkerPool``), the learner's function or the lab's.
  A client with an ``attach(run)`` method gets it before the nemesis is set up (so a crash
  point can be armed in its pool).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from labkit.faults.pool import RunResult, WorkerPool


@dataclass(frozen=True)
class Topic:
    """One of the run's topics: its role (``input``, ``output``, ``changelog``, ...), how
    it is made, and whether the run's records are loaded into it (``loaded``)."""

    role: str
    partitions: int = 1
    config: dict | None = None
    replica_assignment: list | None = None
    loaded: bool = False
    create: bool = True  # False: only named (the pipeline or Kafka makes it)


@dataclass(frozen=True)
class Workload:
    """What the run works on: names from ``stem``, its ``topics``, its ``inputs``."""

    stem: str
    topics: tuple[Topic, ...] = ()
    inputs: list[dict] = field(default_factory=list)
    # writes the input itself, when not one plain load (in transactions, some aborted):
    # load(run) -> the records the audit expects (the run's inputs from then on)
    load: Callable[[Any], list[dict]] | None = None


def prepare(run: Any, workload: Workload) -> None:
    """The workload made real: the run's names, its topics created (deleted with the run),
    the inputs loaded where a topic asks for them (or by the workload's own ``load``)."""
    run.name(workload.stem)
    run.inputs = list(workload.inputs)
    for topic in workload.topics:
        run.create_topic(topic.role, partitions=topic.partitions, config=topic.config,
                         replica_assignment=topic.replica_assignment,
                         inputs=run.inputs if topic.loaded else None, create=topic.create)
    if workload.load is not None:
        run.inputs = list(workload.load(run))


def in_thread(clients: Callable[[Any], Any]) -> Callable[[Any], Callable[[Any], Any]]:
    """Clients that run in the experiment's own thread: ``clients(run)`` is called once, as
    the whole client phase (a producer, a lab's loop whose hooks report its events)."""
    return lambda run: clients


@dataclass
class Workers:
    """N instances of ``worker`` (each called with its ``members[i]`` settings), supervised
    as a pool: restarted when killed until every one has finished. Each instance's
    ``bootstrap`` is the run's client bootstrap (a fault proxy's when one is in between).
    ``RunResult`` goes to the run's facts as ``run``. The run's ``watch`` (a live view's
    factory) gets the topics and the history file and is held while they run."""

    worker: Callable | str
    members: list[dict]
    label: str
    max_attempts: int = 4
    timeout_s: float = 300.0
    restart_failed: bool = False
    on_crash: Callable[[], None] | None = None
    pool: WorkerPool | None = None

    def attach(self, run: Any) -> None:
        self.pool = WorkerPool(self.worker, self.members, label=self.label,
                               history_file=str(run.history_file),
                               max_attempts=self.max_attempts, timeout_s=self.timeout_s,
                               restart_failed=self.restart_failed,
                               on_event=lambda kind, fields: run.event(kind, **fields),
                               on_crash=self.on_crash)
        run.workers = self.pool

    def __call__(self, run: Any) -> RunResult:
        self.pool.defaults["bootstrap"] = run.client_bootstrap
        # a live view (a notebook's dashboard) follows the topics and the workers' history
        watching = run.watch({**run.topics, "history": str(run.history_file)}) \
            if run.watch is not None else nullcontext()
        with watching:
            result = self.pool.run()
        run.facts["run"] = result
        return result
