"""The parts an experiment is composed of, besides its nemesis (labkit.faults) and its
checkers (labkit.checking.checks): its workload and its clients.

- ``Workload``: the run's names (a stem), its topics (roles, partitions, settings; the
  input loaded with the run's records) and those records, which the audit checks against.
- clients: a callable ``clients(run)`` that runs the pipeline under test to its end,
  reporting its steps (``run.step``) and the events faults wait for (``run.event``).
  ``Workers`` are the common kind: N instances of a worker function as supervised child
  processes (``labkit.faults.pool.WorkerPool``), the learner's function or the lab's, or
  of an app's command (a JVM, a script), driven by the experiment's ``script`` if it has
  one (wait for the app's progress, report the events faults wait for, stop it).
  A client with an ``attach(run)`` method gets it before the nemesis is set up (so a crash
  point can be armed in its pool).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from labkit.checking import history
from labkit.faults.background import Background
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
    ``RunResult`` goes to the run's facts as ``run``, the workers' history to the run's
    ``history`` (for the checkers and facts). The run's ``watch`` (a live view's factory)
    gets the topics, the group id and the history file and is held while they run.

    ``command``: an app's command in place of ``worker`` (each instance's settings are its
    environment; its logs, one per start, in the run's directory). ``script(run, app)``: the
    experiment's order of things while the pool is supervised in the background (``app``:
    ``labkit.faults.background.Background``, its ``pool`` and ``wait_for``); the instances
    are stopped when it returns, or fails."""

    worker: Callable | str | None
    members: list[dict]
    label: str
    max_attempts: int = 4
    timeout_s: float = 300.0
    restart_failed: bool = False
    on_crash: Callable[[], None] | None = None
    command: list[str] | None = None
    script: Callable[[Any, Background], None] | None = None
    pool: WorkerPool | None = None

    def attach(self, run: Any) -> None:
        self.pool = WorkerPool(self.worker, self.members, label=self.label,
                               command=self.command,
                               logs_dir=run.workdir if self.command is not None else None,
                               history_file=str(run.history_file),
                               max_attempts=self.max_attempts, timeout_s=self.timeout_s,
                               restart_failed=self.restart_failed,
                               on_event=lambda kind, fields: run.event(kind, **fields),
                               on_crash=self.on_crash)
        run.workers = self.pool

    def __call__(self, run: Any) -> RunResult:
        if self.command is None:  # a worker function's setting (an app's come in its members)
            self.pool.defaults["bootstrap"] = run.client_bootstrap
        # a live view (a notebook's dashboard) follows the topics and the workers' history
        watching = run.watch({**run.topics, "group": run.group_id,
                              "history": str(run.history_file)}) \
            if run.watch is not None else nullcontext()
        with watching:
            if self.script is None:
                self.pool.run()
            else:
                with Background(self.pool) as app:
                    self.script(run, app)
        run.observe(run=self.pool.result)
        run.history = history.read(run.history_file)
        return self.pool.result
