"""A lookup the transform makes when it processes a batch: the review threshold.

Payments above the threshold are held for manual review (not written downstream); the others
are written tagged with the threshold's version. The threshold lives in a one-row table (a
SQLite file, or PostgreSQL through a DSN: labkit.storage.db) that risk operations edit at
any time (``set_threshold``), so the same payment can be processed differently by two
attempts: the transform is not deterministic across a replay.
Used by labkit.spark.replay (Spark sinks) and by the consume-transform-produce pipeline
(``ctp.run(lookup=...)``, labkit.experiments.nondeterminism).
"""
from __future__ import annotations

import json

from labkit.storage.db import Database

THRESHOLD_TABLE = "review_threshold"
V1 = ("v1", 50_000)  # cents: no generated payment is above it (labkit.pipelines.data: at most 50,000)
V2 = ("v2", 25_000)  # about half of them are
VERSION_FIELD = "threshold_version"


def set_threshold(path: str, version: tuple[str, int]) -> None:
    """Write the threshold the next batch will look up (the table holds one row)."""
    name, cents = version
    with Database(path) as db, db.transaction():
        db.execute(f"CREATE TABLE IF NOT EXISTS {THRESHOLD_TABLE} (version TEXT, cents INTEGER)")
        db.execute(f"DELETE FROM {THRESHOLD_TABLE}")
        db.execute(f"INSERT INTO {THRESHOLD_TABLE} (version, cents) VALUES (?, ?)", (name, cents))


def current_threshold(path: str) -> tuple[str, int]:
    """The threshold as the table says now: (version, cents)."""
    with Database(path) as db:
        (name, cents), = db.query(f"SELECT version, cents FROM {THRESHOLD_TABLE}")
    return name, int(cents)


def screen(payment: dict, threshold: tuple[str, int]) -> dict | None:
    """The payment tagged with the threshold's version, or None: held for review."""
    name, cents = threshold
    return {**payment, VERSION_FIELD: name} if payment["amount_cents"] <= cents else None


def processing(inputs: list[dict], threshold: tuple[str, int]) -> dict[str, str]:
    """What one processing of every payment under ``threshold`` writes: id -> version."""
    return {r["id"]: threshold[0] for r in inputs if screen(r, threshold) is not None}


def apply_threshold(path: str, rows: list[dict]) -> list[dict]:
    """The transform (Spark's driver runs it on each micro-batch: labkit.spark.child): look the threshold up now,
    drop payments above it, tag the others' value with the threshold's version."""
    threshold = current_threshold(path)
    out = []
    for r in rows:
        screened = screen(json.loads(r["value"]), threshold)
        if screened is not None:
            out.append({**r, "value": json.dumps(screened)})
    return out
