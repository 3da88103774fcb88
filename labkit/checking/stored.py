"""A run as plain data in a file, read back to be checked again without Kafka (issue 50,
Jepsen's stored histories; ``labkit check PATH``).

    run = experiments.run("judge", phase="point", crash_at="after-commit", pipeline=loop)
    run.store("judged.jsonl")          # RunRecord.store
    again = stored.load("judged.jsonl")  # what ``labkit check`` re-checks

One JSON-lines file. Its first line is the run: the experiment's name, its options, its
topics by role, the inputs the audit compares with, and the live run's report (for a
reader, never used to re-check). Each line after it is one entry of the run's history as it
was written: the workers', the runner's (faults, the wire, the group's offsets) and what
the checkers read of Kafka once the run was over (``read``: labkit.checking.reads).

A stored run is a checker's run (``labkit.checking.checks.Checked``) that answers every
read from its history and has no cluster: a checker that asks for one fails loudly.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.checking.history import facts_of
from labkit.checking.reads import KEPT, OFFSETS, READ, TABLE, Read, columns_of, of_entry

FORMAT = "labkit-run/1"


class NotReplayable(Exception):
    """Why a stored run cannot be checked again offline (yet)."""


@dataclass
class StoredRun:
    experiment: str
    options: dict[str, Any]
    topics: dict[str, str]
    inputs: list[dict]
    history: list[dict] = field(repr=False)
    report: dict | None = None  # the live run's, as it printed (AuditReport.to_dict)
    _answered: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def facts(self) -> dict[str, Any]:
        """The live run's facts, as far as they were plain data (its ``observed`` entries)."""
        return facts_of(self.history)

    @property
    def bootstrap(self) -> str:
        raise NotReplayable("a stored run is checked without Kafka, yet one of its checkers "
                            "asked for the cluster's address")

    def answer_read(self, role: str) -> Read:
        """The checkers' n-th read of the ``role`` topic: the run's n-th ``read`` entry of it
        (they ask in the order the live run's asked)."""
        return of_entry(self._nth(READ, "role", role, f"its {role} topic"))

    def answer_table(self, role: str) -> dict[str, list]:
        """The checkers' n-th read of the ``role`` table: the run's n-th ``table-read`` entry
        of it (labkit.checking.reads.table)."""
        return columns_of(self._nth(TABLE, "role", role, f"its {role} table"))

    def answer_kept(self, role: str) -> object:
        """What a checker computed of the live system for ``role`` (labkit.checking.reads.kept),
        as the live run kept it."""
        return self._nth(KEPT, "role", role, f"its {role}")["value"]

    def _nth(self, kind: str, field_: str, name: str, what: str) -> dict:
        """The next entry of ``kind`` whose ``field_`` is ``name``: the n-th asked for gets
        the n-th the live run wrote."""
        entries = [e for e in self.history if e.get("kind") == kind and e.get(field_) == name]
        n = self._answered.get(f"{kind}:{name}", 0)
        if n >= len(entries):
            raise NotReplayable(
                f"the stored {self.experiment} run holds {len(entries)} read(s) of {what} "
                f"and its checkers ask for read {n + 1}: it was stored before its "
                "checkers kept what they read in the history")
        self._answered[f"{kind}:{name}"] = n + 1
        return entries[n]

    def answer_offsets(self, role: str) -> dict[int, int]:
        """The group's committed offsets on the ``role`` topic as the live run's checker
        read them (its last ``offsets-read`` entry)."""
        entries = [e for e in self.history if e.get("kind") == OFFSETS and e.get("role") == role]
        if not entries:
            raise NotReplayable(f"the stored {self.experiment} run holds no read of its group's "
                                f"offsets on its {role} topic: it was stored before its "
                                "checkers kept them in the history")
        return {int(p): o for p, o in entries[-1]["offsets"].items()}


def store(path: str | Path, *, experiment: str, options: Mapping[str, Any],
          topics: Mapping[str, str], inputs: list[dict], history: list[dict],
          report: dict | None = None) -> Path:
    """Write a run to ``path`` (see the module's docstring); its options must be plain data
    (a re-check builds the checkers from them)."""
    options = {name: str(value) if isinstance(value, Path) else value  # a folder: its path
               for name, value in options.items()}
    for name, value in options.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{experiment}'s option {name} is not plain data ({exc}): the run "
                             "cannot be stored") from None
    head = {"format": FORMAT, "experiment": experiment, "options": options,
            "topics": dict(topics), "inputs": inputs, "report": report}
    path = Path(path)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(head) + "\n")
        for entry in history:
            fh.write(json.dumps(entry) + "\n")
    return path


def load(path: str | Path) -> StoredRun:
    """A stored run, read back (ValueError: not a file ``store`` wrote)."""
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
    head = json.loads(lines[0]) if lines else {}
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise ValueError(f"{path} is not a stored run (its first line names no {FORMAT!r}): "
                         "store one with run.store(path)")
    return StoredRun(head["experiment"], head["options"], head["topics"], head["inputs"],
                     [json.loads(line) for line in lines[1:]], head.get("report"))
