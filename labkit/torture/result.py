"""What a torture run found: the audit of the app's output, what the harness did to the app
(kills, restarts, broker kills) and the stalls it saw, as a verdict, a summary and JSON."""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field

from labkit.checking.audit import AuditReport


@dataclass
class Stall:
    """The app stayed alive without progress for ``stalled_s`` and was SIGKILLed and started
    again. ``after_s``: seconds into the run when its last progress was seen."""

    after_s: float
    stalled_s: float
    consumed: int  # the group's committed offsets on the input, then
    end: int  # the input's end offsets
    written: int  # the output's size as supervise.Watch samples it
    attempt: int  # the start of the app that stalled (1: the first)

    def text(self) -> str:
        return f"no progress for {self.stalled_s:.0f} s after {self.after_s:.1f} s"


@dataclass
class TortureResult:
    """The audit of the output plus what the harness did to the app."""

    report: AuditReport
    command: list[str]
    seed: int
    kills: int = 0  # SIGKILLs of the app's process group
    restarts: int = 0  # starts after the first (after a kill or the app's own crash)
    broker_kills: int = 0
    seconds: float = 0.0
    run_dir: str = ""  # the app's logs (one per start) and the run's history
    restart_s: list[float] = field(default_factory=list)  # SIGKILL sent -> app running again
    notes: list[str] = field(default_factory=list)  # e.g. the app finished before every kill
    fault_stats: dict | None = None  # the fault proxy's counters (with ``fault``)
    partitions: int = 1  # of the input (and the output)
    topics: dict | None = None  # {"input", "output", "kept"}: deleted after the run unless kept
    stalls: list[Stall] = field(default_factory=list)  # each restarted (counted in restarts)

    @property
    def verdict(self) -> str:
        return self.report.verdict

    def anomalies(self) -> dict[str, dict]:
        """Checker name -> its count and examples, for the checkers that found something."""
        return {r.name: {"count": r.count, "examples": r.examples}
                for r in self.report.findings() if not r.valid}

    def to_dict(self) -> dict:
        d = self.report.to_dict()  # the keys of `labkit scenario --json`, in order
        d["anomalies"] = self.anomalies()
        return {**d, "kills": self.kills, "restarts": self.restarts,
                "broker_kills": self.broker_kills, "seconds": self.seconds,
                "command": self.command, "seed": self.seed, "run_dir": self.run_dir,
                "notes": self.notes, "fault_stats": self.fault_stats,
                "partitions": self.partitions, "topics": self.topics,
                "stalled": len(self.stalls), "stalls": [asdict(s) for s in self.stalls]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def summary(self) -> str:
        r = self.report
        lines = [f"{shlex.join(self.command)}",
                 f"  kills={self.kills} restarts={self.restarts} broker_kills={self.broker_kills} "
                 f"seconds={self.seconds}",
                 f"  produced={r.produced} delivered_unique={r.delivered_unique} lost={r.lost} "
                 f"duplicated={r.duplicated} reordered={r.reordered} "
                 f"aborted_visible={r.aborted_visible} aborted_in_log={r.aborted_in_log}"]
        if self.stalls:  # a finding beside the audit's: the verdict is the output's alone
            lines.append(f"  stalled {len(self.stalls)}× ("
                         + ", ".join(s.text() for s in self.stalls) + "; restarted)")
        for name, found in self.anomalies().items():
            lines.append(f"  {name}: {found['count']}, e.g. {found['examples']}")
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"  verdict: {self.verdict}")
        return "\n".join(lines)
