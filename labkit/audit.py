"""The audit: ground truth about what a pipeline did to the data.

It compares the ids that went in with what is observable afterwards (an output topic read
with read_committed, a database table, the final state) and never looks at the pipeline's
own bookkeeping. Findings are named after Jepsen's Kafka checker so a learner can look
them up: lost write, duplicate, non-monotonic (reordered), aborted read, state drift.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pandas as pd

# The exact keys `labkit scenario --json` prints, in order.
REPORT_KEYS = (
    "scenario", "guarantee", "crash_at", "fault", "produced", "delivered_unique", "lost",
    "duplicated", "reordered", "aborted_visible", "state_expected", "state_actual",
)


@dataclass
class AuditReport:
    scenario: str
    guarantee: str
    crash_at: str | None = None
    fault: str | None = None
    produced: int = 0
    delivered_unique: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    aborted_visible: int = 0
    state_expected: dict | int | None = None
    state_actual: dict | int | None = None
    # Examples of each finding, for explanations (not part of the JSON contract).
    examples: dict[str, list] = field(default_factory=dict, repr=False, compare=False)

    @property
    def state_matches(self) -> bool:
        return self.state_expected == self.state_actual

    @property
    def exactly_once(self) -> bool:
        return (self.lost == 0 and self.duplicated == 0 and self.aborted_visible == 0
                and self.state_matches)

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: d[k] for k in REPORT_KEYS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    def to_frame(self) -> pd.DataFrame:
        row = self.to_dict()
        for key in ("state_expected", "state_actual"):
            if isinstance(row[key], dict):
                row[key] = json.dumps(row[key], sort_keys=True)
        return pd.DataFrame([row], columns=list(REPORT_KEYS))

    def summary(self) -> str:
        """A short, stable text for notebooks (nbval compares it)."""
        verdict = "exactly once" if self.exactly_once else "NOT exactly once"
        state = ""
        if self.state_expected is not None:
            state = f"  state: {'matches' if self.state_matches else 'DRIFTED'}"
        return (f"{self.scenario} [{self.guarantee}] crash_at={self.crash_at} fault={self.fault}\n"
                f"  produced={self.produced} delivered_unique={self.delivered_unique} "
                f"lost={self.lost} duplicated={self.duplicated} reordered={self.reordered} "
                f"aborted_visible={self.aborted_visible}{state}\n  verdict: {verdict}")
