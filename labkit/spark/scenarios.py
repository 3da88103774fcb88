"""Spark scenarios for `labkit scenario spark-...` (filled in by the Spark streaming work).

Each entry maps a scenario name to a function
``(bootstrap: str, guarantee: str, crash_at: str | None, records: int) -> AuditReport``.
"""
from __future__ import annotations

from collections.abc import Callable

from labkit.audit import AuditReport

SPARK_SCENARIOS: dict[str, Callable[..., AuditReport]] = {}
