"""A run's history: what each worker did and when, one JSON object per line.

Workers call ``record("assigned", partitions=[0, 1])``; the supervisor names the file
through ``LABKIT_HISTORY`` (and the instance through ``LABKIT_INSTANCE``) when it starts
them, and reads it back afterwards (``read``). Appends of one short line are atomic on
Linux, so several worker processes share one file. Without ``LABKIT_HISTORY`` nothing is
written: a pipeline run by hand needs no supervisor.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from labkit import settings

ENV_FILE, ENV_INSTANCE, ENV_ATTEMPT = settings.HISTORY, settings.INSTANCE, settings.ATTEMPT
# What the runner itself writes beside the processes' events: a fault it invoked (``fault``),
# a transactional exchange the fault proxy saw (``wire``), what the supervision read at the
# end (``finished``: the group's offsets, the input's end, who was still running), the
# transactions it found open then (``open-transactions``), what a checker read of a topic,
# a table or the group's offsets once the run was over, or computed of it (``read``,
# ``table-read``, ``offsets-read``, ``kept``: labkit.checking.reads), where the lab's feed
# wrote each input record (``written``), what a part of the run observed (``observed``: the
# run's facts are made of these, ``facts_of``). The checkers read them; the processes'
# timeline (``labkit.checking.timeline.text``) leaves them out.
CHECKER_KINDS = frozenset({"read", "table-read", "offsets-read", "kept"})
OBSERVED = "observed"
RUNNER_KINDS = frozenset({"fault", "wire", "finished", "open-transactions", "written",
                          OBSERVED, *CHECKER_KINDS})
# LABKIT_ATTEMPT: 1 for an instance's first start, 2 after its first restart


def attempt() -> int:
    """Which start of this instance this is (1 when no supervisor says)."""
    return settings.current().attempt


def record(kind: str, **fields: object) -> None:
    """A worker's event (``kind`` plus plain-data ``fields``), if a history file is set."""
    now = settings.current()
    if now.history_file:
        append(now.history_file, kind, pid=os.getpid(), instance=now.instance or None,
               attempt=now.attempt, **fields)


def append(path: str | Path, kind: str, **fields: object) -> None:
    """Append one event to ``path`` (the supervisor's side: it names the instance itself;
    an entry of the runner's own names none: ``instance`` None)."""
    event = {"t": round(time.time(), 3), "kind": kind,
             **({"instance": None} if kind in RUNNER_KINDS else {}), **fields}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(event) + "\n")


def read(path: str | Path) -> list[dict]:
    """Every event of a history file, in the order written (an absent file: none)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def facts_of(events: list[dict]) -> dict:
    """The run's facts: its ``observed`` entries merged in order (a later value of a name
    wins), from the last one that started the run over (``start_over``: made again)."""
    facts: dict = {}
    for event in events:
        if event.get("kind") != OBSERVED:
            continue
        if event.get("start_over"):
            facts = {}
        facts.update(event.get("facts") or {})
    return facts
