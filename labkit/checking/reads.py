"""What a checker reads of Kafka once the run is over, kept in the run's history (issue 50:
a run is plain data, and can be checked again, as Jepsen's stored histories).

    read = reads.topic(run, "output")           # both readers; one ``read`` history entry
    read.everything, read.committed, read.seen_by("read_committed")

Every checker that reads a topic for its verdict goes through ``topic``. On a live run it
reads the topic as a read_uncommitted and as a read_committed consumer, appends what they
got to the run's history as one entry, and answers from that entry; on a stored run
(``labkit.checking.stored.StoredRun``) the same call is answered from the stored entry, and
Kafka is not contacted. So the live verdict and the re-checked one are computed from the
same data.

The entry: ``{"kind": "read", "role": "output", "topic": <name>, "records": [[partition,
offset, key, value, readers], ...]}`` (a stamped read: the record's timestamp last). ``readers`` says who got the record: ``"cu"`` both,
``"u"`` the read_uncommitted reader only (an aborted or still open transaction's), ``"c"``
the read_committed reader only (written between the two reads). Records are in the order
the read_uncommitted reader got them (log order per partition), then the "c" ones.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from labkit.checking import history
from labkit.kafka import topics
from labkit.kafka.clientlog import client_config
from labkit.kafka.topics import Rec
from labkit.storage.db import read_table

READ = "read"  # the history entry's kind
OFFSETS = "offsets-read"  # a group's committed offsets, read once the run was over
WRITTEN = "written"  # where the lab's feed wrote each input record (labkit.experiments.feed)
TABLE = "table-read"  # a table's rows, read once the run was over (a database sink's audit)
KEPT = "kept"  # what a checker computed of the live system once the run was over


@dataclass(frozen=True)
class Read:
    """A topic as each reader got it, in log order per partition."""

    everything: list[Rec]  # read_uncommitted
    committed: list[Rec]  # read_committed

    def seen_by(self, isolation: str) -> list[Rec]:
        """The records a consumer reading with ``isolation`` got."""
        if isolation not in topics.ISOLATION_LEVELS:
            raise ValueError(f"isolation must be one of {topics.ISOLATION_LEVELS}, "
                             f"not {isolation!r}")
        return self.committed if isolation == "read_committed" else self.everything


def topic(run: Any, role: str = "output", at: Callable[[], str] | None = None,
          stamped: bool = False) -> Read:
    """The run's topic for ``role`` as both readers see it now: read from Kafka and kept in
    the run's history (a live run), or the stored run's entry for this read. ``at()``: the
    bootstrap to read from, if not the run's (a live run's only: not called on a stored
    one; e.g. a new leader's, while the old one still starts). ``stamped``: each record's
    timestamp kept too (a checker that measures delays)."""
    answer = getattr(run, "answer_read", None)  # a stored run answers, Kafka is not asked
    if answer is not None:
        return answer(role)
    name = run.topics[role]
    bootstrap = at() if at is not None else run.bootstrap
    everything = topics.read(bootstrap, name, isolation="read_uncommitted")
    committed = topics.read(bootstrap, name, isolation="read_committed")
    entry = entry_of(role, name, everything, committed, stamped)
    # a run without a history file (a checker called by hand) keeps nothing. The line is
    # long, but the run's processes are gone by now: no other append interleaves with it
    path = getattr(run, "history_file", None)
    if path is not None:
        history.append(path, READ, **entry)
    return of_entry(entry)  # the live verdict is computed from what a re-check reads


def entry_of(role: str, name: str, everything: list[Rec], committed: list[Rec],
             stamped: bool = False) -> dict:
    """The history entry of one read (see the module's docstring): compact, plain data;
    ``stamped``: each record's timestamp (ms) after its readers."""
    at = {(r.partition, r.offset) for r in committed}
    got = {(r.partition, r.offset) for r in everything}
    stamp = (lambda r: [r.timestamp_ms]) if stamped else (lambda r: [])
    records = [[r.partition, r.offset, r.key, r.value,
                "cu" if (r.partition, r.offset) in at else "u", *stamp(r)] for r in everything]
    records += [[r.partition, r.offset, r.key, r.value, "c", *stamp(r)] for r in committed
                if (r.partition, r.offset) not in got]
    return {"role": role, "topic": name, "records": records}


def of_entry(entry: dict) -> Read:
    """The Read a history entry holds."""
    recs = [(Rec(p, o, k, v, *stamp), readers) for p, o, k, v, readers, *stamp
            in entry["records"]]
    return Read([r for r, readers in recs if "u" in readers],
                [r for r, readers in recs if "c" in readers])


def table(run: Any, role: str, columns: Sequence[str], at: Callable[[], tuple[str, str]],
          order_by: str | None = None) -> dict[str, list]:
    """The ``columns`` of the run's ``role`` table (in ``order_by``'s order, else insertion
    order: ``labkit.storage.db.read_table``), column -> values: read from the database and
    table ``at()`` names (a live run's: a table name may hold the run's id) and kept in the
    run's history as one ``table-read`` entry, or the stored run's entry for this read (the
    database is not asked; ``at`` is not called).

    The entry: ``{"kind": "table-read", "role": role, "table": <name>, "columns": [...],
    "rows": [[value of each column], ...]}``, only the columns the checker asked for."""
    answer = getattr(run, "answer_table", None)
    if answer is not None:
        return answer(role)
    db, name = at()
    frame = read_table(db, name, list(columns), order_by=order_by)
    # tolist(): plain Python values (numpy's integers are not JSON)
    entry = {"role": role, "table": name, "columns": list(columns),
             "rows": [list(row) for row in zip(*(frame[c].tolist() for c in columns))]}
    _keep(run, TABLE, entry)
    return columns_of(entry)  # the live verdict is computed from what a re-check reads


def kept(run: Any, role: str, compute: Callable[[], Any]) -> Any:
    """What ``compute()`` finds of the live system once the run is over that no topic or table
    read gives (a Spark batch recount of the input), as plain data: computed and kept in the
    run's history as one ``kept`` entry ``{"role": role, "value": ...}`` (a live run), or the
    stored run's entry (``compute`` is not called). Kept small: a summary, not a copy."""
    answer = getattr(run, "answer_kept", None)
    if answer is not None:
        return answer(role)
    entry = {"role": role, "value": compute()}
    _keep(run, KEPT, entry)
    return json.loads(json.dumps(entry["value"]))  # as a re-check will read it back


def _keep(run: Any, kind: str, entry: dict) -> None:
    """One entry of the run's history; a run without a history file (a checker called by
    hand) keeps nothing."""
    path = getattr(run, "history_file", None)
    if path is not None:
        history.append(path, kind, **entry)


def columns_of(entry: dict) -> dict[str, list]:
    """The columns a ``table-read`` entry holds: column -> its values, row by row."""
    return {c: [row[n] for row in entry["rows"]] for n, c in enumerate(entry["columns"])}


def committed(run: Any, role: str = "input") -> dict[int, int]:
    """The run's group's committed offset of each partition of its ``role`` topic, read now
    (0 where it has committed none: a restart starts there) and kept in the run's history as
    one ``offsets-read`` entry; a stored run answers from that entry."""
    answer = getattr(run, "answer_offsets", None)
    if answer is not None:
        return answer(role)
    name = run.topics[role]
    # the committed offsets as they stand (read_committed would wait for a pending
    # transaction's); this consumer only asks, it never joins the group
    consumer = Consumer(client_config({
        "bootstrap.servers": run.bootstrap, "group.id": run.group_id,
        "enable.auto.commit": False, "isolation.level": "read_uncommitted"}))
    try:
        got = consumer.committed([TopicPartition(name, p)
                                  for p in topics.partitions_of(run.bootstrap, name)],
                                 timeout=30)
    finally:
        consumer.close()
    offsets = {tp.partition: max(tp.offset, 0) for tp in got}
    path = getattr(run, "history_file", None)
    if path is not None:
        history.append(path, OFFSETS, role=role, offsets={str(p): o for p, o in offsets.items()})
    return offsets


def restart_reads(run: Any, role: str = "input") -> frozenset[str]:
    """The ids of the ``role`` records a restart of the run's group reads again: written
    (the feed's ``written`` entries say where) at or past the group's committed offset of
    their partition. Missing from the output, such a record is not lost: it was never
    processed, and the group has not committed past it."""
    at = written_at(events(run), role)
    return frozenset(read_again(at, committed(run, role))) if at else frozenset()


def events(run: Any) -> list[dict]:
    """The run's history as a checker sees it: a live run's file as written so far (the
    workers', the faults', the reads before this one), or a stored run's entries."""
    path = getattr(run, "history_file", None)
    return history.read(path) if path is not None else run.history


def written_at(events: list[dict], role: str = "input") -> dict[str, list[int]]:
    """Where the feed wrote each ``role`` record (its ``written`` entries): id -> [partition,
    offset]."""
    return {i: where for e in events if e.get("kind") == WRITTEN and e.get("role") == role
            for i, where in e["at"].items()}


def read_again(at: dict[str, list[int]], offsets: dict[int, int]) -> list[str]:
    """The ids of ``at`` a restart from the committed ``offsets`` reads again (at or past its
    partition's offset), in log order."""
    return sorted((i for i, (partition, offset) in at.items()
                   if offset >= offsets.get(partition, 0)), key=lambda i: tuple(at[i]))
