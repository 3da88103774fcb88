"""One run record for every experiment: what was checked, what happened, what it found.

    run = experiments.run("consume-transform-produce", guarantee="exactly_once", crash_at="mid-batch")
    run.report.verdict        # the one audit (labkit.checking.audit.AuditReport)
    run.summary(); run.to_json(); run.timeline()
    run.cleanup()             # the topics and directory it kept for later cells, deleted
    run.store("run.jsonl")    # plain data, checked again without Kafka: labkit check run.jsonl
    run.topics, run.history, run.steps, run.faults   # the run's names, events, steps, faults
    run.zombie_error          # an experiment's own facts read as attributes (run.facts)

Jepsen keeps one history and one result map per test; so does the lab. The record is plain
data: the experiment's facts (the coordinators it went through, the errors its client saw,
a Spark batch's ids) are a dict read back as attributes, so a notebook reads
``run.errors`` whatever experiment made it. How a record prints (its summary, its JSON, its
timeline's extra column) is the experiment's, given once where it is declared.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from labkit.checking import timeline as timelines
from labkit.checking.audit import AuditReport


@dataclass(frozen=True)
class Step:
    """A line of the run's timeline: seconds since the run began, what happened, and what
    the experiment saw then (a partition's state, '' when nothing)."""

    at_s: float
    what: str
    detail: str = ""


@dataclass(frozen=True)
class FiredFault:
    """A fault the nemesis injected: when (seconds since the clients started), which fault,
    and what it did."""

    at_s: float
    fault: str
    what: str


@dataclass(frozen=True)
class Presentation:
    """How an experiment's record prints: ``summary(run)`` (default: the audit's); its JSON
    is the audit's keys then the facts named in ``json_facts``, in that order, or
    ``json(run)`` where an experiment's JSON has a shape of its own."""

    summary: Callable[["RunRecord"], str] | None = None
    json_facts: tuple[str, ...] = ()
    json: Callable[["RunRecord"], dict] | None = None


PLAIN = Presentation()


@dataclass
class RunRecord:
    experiment: str
    report: AuditReport
    topics: Mapping[str, str] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list, repr=False)
    steps: list[Step] = field(default_factory=list, repr=False)
    faults: list[FiredFault] = field(default_factory=list, repr=False)
    facts: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict, repr=False)
    presentation: Presentation = field(default=PLAIN, repr=False, compare=False)
    # deletes what the run kept (its topics, its directory): the run context's
    release: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    inputs: list[dict] = field(default_factory=list, repr=False)  # what the audit compares with

    def __getattr__(self, name: str) -> Any:
        # only called for names that are not fields: the experiment's facts
        facts = self.__dict__.get("facts", {})
        if name in facts:
            return facts[name]
        raise AttributeError(f"{self.experiment} run has no {name!r}; its facts: "
                             f"{', '.join(facts) or 'none'}")

    def cleanup(self) -> None:
        """Delete what the run kept for later cells (``keep_topics``, ``keep_workdir``): its
        topics and its directory. The facts read so far stay."""
        if self.release is not None:
            self.release()

    def store(self, path: str | Path) -> Path:
        """The run as one JSON-lines file at ``path`` (labkit.checking.stored), to be checked
        again without Kafka: ``labkit check PATH``. Only where asked: a run leaves nothing
        behind by itself (its directory goes unless kept), and the caller knows where a
        run worth keeping belongs (a test's tmp_path, a course's folder)."""
        from labkit.checking import stored

        return stored.store(path, experiment=self.experiment, options=self.options,
                            topics=self.topics, inputs=self.inputs, history=self.history,
                            report=self.report.to_dict())

    @property
    def verdict(self) -> str:
        return self.report.verdict

    def anomalies(self) -> dict[str, dict]:
        """Checker name -> its count and examples, for the checkers that found something."""
        return {r.name: {"count": r.count, "examples": r.examples}
                for r in self.report.findings() if not r.valid}

    def summary(self) -> str:
        if self.presentation.summary is not None:
            return self.presentation.summary(self)
        return self.report.summary()

    def to_dict(self) -> dict:
        if self.presentation.json is not None:
            return self.presentation.json(self)
        return {**self.report.to_dict(),
                **{name: self.facts.get(name) for name in self.presentation.json_facts}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def timeline(self) -> str:
        """The run's steps (the faults the nemesis fired among them), each with its detail;
        a run without steps: its workers' history, one line per event."""
        if not self.steps:
            return timelines.text(self.history)
        width = max((len(s.what) for s in self.steps if s.detail), default=0)
        return "\n".join(f"{s.at_s:5.1f} s  {s.what:<{width}} {s.detail}".rstrip()
                         for s in self.steps)

    # A group's story, from the workers' history (labkit.checking.timeline).
    def ownership(self) -> pd.DataFrame:
        """Which instance owned which partition, when."""
        return timelines.ownership(self.history)

    def rebalance_pause(self) -> float | None:
        """Seconds from the crash to its partitions being processed again."""
        return timelines.rebalance_pause(self.history)

    def takeover(self) -> timelines.Takeover | None:
        """How the group got over the crash."""
        return timelines.takeover(self.history)
