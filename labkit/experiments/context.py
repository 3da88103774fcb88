"""A run's context: everything an experiment's parts share while it runs, and the
boilerplate each experiment used to write for itself.

- **names**: one stem per run (``<experiment>-<label>-<run id>`` in the learner's
  namespace, ``labkit.kafka.names``) from which its topics (``topic("input")`` is
  ``<stem>-in``), group id and transactional ids are derived;
- **topics**: created through it and deleted when the run ends, also after a failure,
  unless the run keeps them (``keep_topics``); a working directory likewise;
- **steps**: each ``step`` is a line of the run's timeline, told to the watchdog (progress)
  and shown on the progress line; ``event`` is what the nemesis's triggers listen to;
- **facts**: what the run found besides the audit, read back as attributes of its record:
  each part says what it saw with ``observe``, an ``observed`` entry of the run's history,
  and the facts are those entries merged (``labkit.checking.history.facts_of``); nobody
  writes them any other way.

The parts of an experiment (labkit.experiments.parts) receive it; so do the nemesis's
faults (as ``labkit.faults.nemesis.Run``).
"""
from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

from labkit import progress
from labkit.checking import history
from labkit.checking.record import FiredFault, Step
from labkit.faults.nemesis import Event, Fault, Nemesis
from labkit.kafka import names as namespace
from labkit.kafka import topics as kafka_topics
from labkit.paths import lab_home

# role -> the suffix of its topic's name (the names runs have always had)
SUFFIXES = {"input": "in", "output": "out"}


class RunContext:
    """One run of one experiment (see the module's docstring)."""

    def __init__(self, experiment: str, options: Mapping[str, Any], *,
                 bootstrap: str | None = None, cluster: Any = None,
                 pipeline: Callable | None = None, watch: Callable | None = None,
                 announce: Callable[[str], None] = print):
        self.experiment = experiment
        self.options = dict(options)
        self.o = SimpleNamespace(**self.options)  # the options as attributes
        self.bootstrap = bootstrap or ""  # the cluster's, for the lab's own reads and writes
        self.client_bootstrap = self.bootstrap  # the clients': a fault proxy's, when one is between
        self.cluster, self.pipeline, self.watch, self.announce = cluster, pipeline, watch, announce
        self.run_id = uuid.uuid4().hex[:8]
        self.base = ""
        self.topics: dict[str, str] = {}
        self.inputs: list[dict] = []
        self.steps: list[Step] = []
        self.fired_faults: list[FiredFault] = []
        self._observed: list[dict] = []  # the history's observed entries, as observed
        self.history: list[dict] = []
        self.clients: Any = None
        self.workers: Any = None  # a labkit.faults.pool.WorkerPool, when the clients are one
        self.db: Any = None  # the system beside Kafka (labkit.experiments.db), when it has one
        self.progress: Any = None  # an app's progress as Kafka shows it (GroupProgress)
        self.nemesis = Nemesis()
        self.keep_topics = bool(self.options.get("keep_topics", False))
        self.keep_workdir = bool(self.options.get("keep_workdir", False))
        self._made: list[str] = []
        self._undo: list[Callable[[], None]] = []
        self._workdir: Path | None = None
        self._started = time.monotonic()
        self._say: Callable[[str], None] = lambda line: None

    # ------------------------------------------------------------------ names

    def name(self, stem: str) -> str:
        """The run's stem, ``<stem>-<run id>`` in the learner's namespace; set once (until
        ``again``)."""
        if not self.base:
            self.base = namespace.qualify(f"{stem}-{self.run_id}".replace("_", "-"))
        return self.base

    def topic_name(self, role: str) -> str:
        return f"{self.base}-{SUFFIXES.get(role, role)}"

    @property
    def group_id(self) -> str:
        return self.base

    def transactional_id(self, instance: int | None = None) -> str:
        return f"{self.base}-txn" if instance is None else f"{self.base}-txn-{instance}"

    # ------------------------------------------------------------------ topics and files

    def create_topic(self, role: str, *, partitions: int = 1, config: dict | None = None,
                     replica_assignment: list | None = None, inputs: list[dict] | None = None,
                     create: bool = True) -> str:
        """The run's topic for ``role``, created (and loaded with ``inputs``), deleted when
        the run ends unless it keeps its topics. ``create=False``: named only (a pipeline
        or Kafka creates it)."""
        from labkit.pipelines import data

        name = self.topic_name(role)
        self.topics[role] = name
        self._made.append(name)
        if inputs is not None:
            data.load_into_topic(self.bootstrap, name, inputs, partitions=partitions)
        elif create:
            kafka_topics.create(self.bootstrap, name, partitions=partitions, config=config,
                                replica_assignment=replica_assignment)
        return name

    def owns(self, *names: str) -> None:
        """Topics made by others for this run (an app's own), deleted with the run's."""
        self._made.extend(n for n in names if n not in self._made)

    def on_close(self, undo: Callable[[], None]) -> None:
        """Something the run made besides its topics and its directory (a database, a
        replication slot), undone when the run ends, also after a failure; last made first."""
        self._undo.append(undo)

    @property
    def workdir(self) -> Path:
        """The run's directory under the lab's home, removed when it ends (unless kept)."""
        if self._workdir is None:
            self._workdir = lab_home() / "runs" / (self.base or f"{self.experiment}-{self.run_id}")
            self._workdir.mkdir(parents=True, exist_ok=True)
        return self._workdir

    @property
    def history_file(self) -> Path:
        return self.workdir / "history.jsonl"

    def close(self, failed: bool = False) -> None:
        """The run's end, whatever happened: what it made is undone (``on_close``), its
        topics and directory go unless kept; a failed run keeps no topics (nothing in them
        is worth reading). The first error of an undo is raised once all is done."""
        error: BaseException | None = None
        while self._undo:
            try:
                self._undo.pop()()
            except BaseException as exc:  # the rest is cleaned up all the same
                error = error or exc
        self._close_files_and_topics(failed)
        if error is not None:
            raise error

    def _close_files_and_topics(self, failed: bool) -> None:
        if self._workdir is not None and self._workdir.exists():
            written = history.read(self.history_file)
            # clients that keep their own events (Spark's attempts) keep them; the file
            # then holds only the runner's entries
            if not self.history or any(e.get("kind") not in history.RUNNER_KINDS
                                       for e in written):
                self.history = written
            else:  # what the checkers read, and the facts, join them: a stored run is
                # checked again from it
                self.history = [*self.history, *(
                    e for e in written
                    if e.get("kind") in (*history.CHECKER_KINDS, history.OBSERVED)
                    and e not in self.history)]  # a second close (discard) adds none again
            if not self.keep_workdir:
                shutil.rmtree(self._workdir, ignore_errors=True)
        if self._made and (failed or not self.keep_topics) and self.bootstrap:
            kafka_topics.delete(self.bootstrap, *self._made)
            self._made = []

    def discard(self) -> None:
        """What the run kept for a notebook's next cells (its topics, its directory) deleted
        now: ``RunRecord.cleanup``."""
        self.keep_topics = self.keep_workdir = False
        self.close()

    def again(self) -> None:
        """The run made again (its fault missed its window): new names, so new topics; the
        old ones are deleted with the run's; its facts start over, its timeline goes on."""
        self.run_id, self.base = uuid.uuid4().hex[:8], ""
        self.topics, self.inputs = {}, []
        self._observe({}, start_over=True)
        self.clients = self.workers = None
        self.nemesis = Nemesis()
        self.client_bootstrap = self.bootstrap

    # ------------------------------------------------------------------ facts

    @property
    def facts(self) -> Mapping[str, Any]:
        """What the run's parts observed (read-only: ``observe`` adds to it)."""
        return MappingProxyType(history.facts_of(self._observed))

    def observe(self, **facts: Any) -> None:
        """What a part saw, an ``observed`` entry of the run's history: its plain data is
        written there (a stored run has it); a value that is not plain data (a Spark job,
        a DataFrame) is this live run's only, named in the entry by its type."""
        self._observe(facts)

    def _observe(self, facts: dict[str, Any], **marks: Any) -> None:
        plain, live = {}, {}
        for name, value in facts.items():
            try:
                json.dumps(value)
                plain[name] = value
            except (TypeError, ValueError):
                live[name] = type(value).__name__
        history.append(self.history_file, history.OBSERVED, facts=plain,
                       **({"not_stored": live} if live else {}), **marks)
        self._observed.append({"kind": history.OBSERVED, "facts": dict(facts), **marks})

    # ------------------------------------------------------------------ steps and events

    def elapsed(self) -> float:
        return round(time.monotonic() - self._started, 1)

    def step(self, what: str, waiting_for: str | None = "its next step",
             detail: str = "") -> None:
        """A line of the timeline: recorded, told to the watchdog, on the progress line
        (``waiting_for`` None: the run still waits for what its last step said)."""
        progress.check()  # a run its watchdog stopped breaks nothing more
        self.steps.append(Step(self.elapsed(), what, detail))
        progress.step(what, waiting_for)
        self._say(what)

    def event(self, kind: str, **fields: Any) -> bool:
        """Something the clients did that a fault may be waiting for (synchronously: the
        fault fires before this returns); whether one fired (and told the timeline)."""
        return self.nemesis.notify(self, Event(kind, fields))

    def fired(self, fault: Fault, what: str, **fields: Any) -> None:
        """What a fault did: a step of the timeline, a fault the verdict can name (the run
        still waits for what its clients' last step said) and an entry of the run's history
        (``fields``: plain data a checker reads, e.g. the instances it acted on)."""
        self.fired_faults.append(FiredFault(self.elapsed(), fault.name, what))
        history.append(self.history_file, "fault", fault=type(fault).__name__, name=fault.name,
                       what=what, **fields)
        self.step(what, None)

    def saying(self, say: Callable[[str], None]) -> None:
        """Where steps are shown (the experiment's progress line)."""
        self._say = say

    @contextmanager
    def status(self, message: str) -> Iterator[None]:
        """A progress line for the block (``message``, ticked when it ends), each step of
        the run shown on it meanwhile."""
        with progress.status(message) as say:
            self._say = say
            try:
                yield
            finally:
                self._say = lambda line: None


def options_view(values: Mapping[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(**values)
