"""Read a Structured Streaming checkpoint: planned batches, commits, state store versions.

Spark's protocol for each micro-batch N, visible in the checkpoint directory:
1. ``offsets/N`` is written BEFORE the batch runs: the Kafka end offsets it will read up to
   (the write-ahead log);
2. the sink runs;
3. ``commits/N`` is written AFTER the sink returned.
A batch with ``offsets/N`` but no ``commits/N`` is re-run on restart with the same offsets:
that is the replay a crash between 2 and 3 causes.

This module also guards the checkpoint's identity: a checkpoint belongs to one query (name)
reading one topic, recorded in ``labkit-query.json``; reusing it for another is refused.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

IDENTITY_FILE = "labkit-query.json"
BATCH_COLUMNS = ["batch_id", "topic", "partition", "start_offset", "end_offset", "records",
                 "committed"]


class StaleCheckpoint(ValueError):
    """The checkpoint directory belongs to another query."""


def claim(checkpoint: str | Path, query: str, topic: str) -> Path:
    """Create the checkpoint dir for (query, topic), or check it already belongs to them."""
    path = Path(checkpoint)
    ident = path / IDENTITY_FILE
    wanted = {"query": query, "topic": topic}
    if ident.exists():
        found = json.loads(ident.read_text())
        if found != wanted:
            raise StaleCheckpoint(
                f"checkpoint {path} belongs to query {found.get('query')!r} reading topic "
                f"{found.get('topic')!r}, not to query {query!r} reading {topic!r}. Spark would "
                "resume from the other query's offsets. Use a new checkpoint directory, or delete "
                f"this one (rm -r {path}) to start the query from scratch.")
    elif (path / "offsets").exists():
        raise StaleCheckpoint(
            f"checkpoint {path} holds a query's offsets but no {IDENTITY_FILE}, so it cannot be "
            f"checked to belong to query {query!r} reading {topic!r}. Use a new checkpoint "
            f"directory, or delete this one (rm -r {path}).")
    else:
        path.mkdir(parents=True, exist_ok=True)
        ident.write_text(json.dumps(wanted))
    return path


def _log_entries(directory: Path) -> dict[int, list[str]]:
    """Spark's metadata logs: files named by batch id, a version line then JSON lines."""
    if not directory.is_dir():
        return {}
    entries = {}
    for f in directory.iterdir():
        if f.name.isdigit():  # skip .crc and temp files
            entries[int(f.name)] = f.read_text().splitlines()[1:]
    return dict(sorted(entries.items()))


def planned_offsets(checkpoint: str | Path) -> dict[int, dict[str, dict[int, int]]]:
    """batch id -> {topic: {partition: end offset}} from ``offsets/N`` (one Kafka source)."""
    out = {}
    for batch, lines in _log_entries(Path(checkpoint) / "offsets").items():
        # lines[0] is the batch metadata (watermark, timestamp, conf); then one line per source
        source = json.loads(lines[1]) if len(lines) > 1 else {}
        out[batch] = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in source.items()}
    return out


def committed_batches(checkpoint: str | Path) -> list[int]:
    return list(_log_entries(Path(checkpoint) / "commits"))


def starting_positions(starting_offsets: str) -> dict[str, dict[int, int]] | None:
    """Where batch 0 began, from a query's ``startingOffsets`` option: None for "earliest" or
    "latest", else the JSON's offsets (-2, "earliest", is offset 0 on the lab's topics)."""
    if not starting_offsets.startswith("{"):
        return None
    return {t: {int(p): max(int(o), 0) for p, o in parts.items()}
            for t, parts in json.loads(starting_offsets).items()}


def batches(checkpoint: str | Path, start: dict[str, dict[int, int]] | None = None) -> pd.DataFrame:
    """One row per (batch, partition): the offset range it covers and whether it is committed.

    ``start`` is where batch 0 began (default 0 for every partition, i.e. "earliest" on a
    topic that was never truncated).
    """
    committed = set(committed_batches(checkpoint))
    previous = {t: dict(parts) for t, parts in (start or {}).items()}
    rows = []
    for batch, source in planned_offsets(checkpoint).items():
        for topic, parts in source.items():
            for part, end in sorted(parts.items()):
                begin = previous.get(topic, {}).get(part, 0)
                rows.append((batch, topic, part, begin, end, end - begin, batch in committed))
                previous.setdefault(topic, {})[part] = end
    return pd.DataFrame(rows, columns=BATCH_COLUMNS)


def state_versions(checkpoint: str | Path) -> pd.DataFrame:
    """State store files: operator, partition, version and kind (delta/snapshot/changelog)."""
    rows = []
    root = Path(checkpoint) / "state"
    if root.is_dir():
        for f in root.glob("*/*/*"):
            stem, _, kind = f.name.partition(".")
            if f.is_file() and stem.isdigit() and f.parts[-3].isdigit() and f.parts[-2].isdigit():
                rows.append((int(f.parts[-3]), int(f.parts[-2]), int(stem), kind, f.stat().st_size))
    frame = pd.DataFrame(rows, columns=["operator", "partition", "version", "kind", "bytes"])
    return frame.sort_values(["operator", "partition", "version"], ignore_index=True)

