"""What a run's history says happened over time: who owned which partition, and for how long
a dead member's partitions sat unprocessed. Plain data in (the events of ``labkit.checking.history``),
DataFrames and numbers out; ``labkit.widgets.timeline`` draws them.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labkit.checking import history

KILLED = -9  # the exit code of a SIGKILLed worker


def ownership(events: list[dict]) -> pd.DataFrame:
    """One row per (instance start, partition) ownership span: instance, attempt, partition,
    start and end in seconds from the run's first event (end: the next change, or the
    instance's exit)."""
    if not events:
        return pd.DataFrame(columns=["instance", "attempt", "partition", "start", "end"])
    t0 = min(e["t"] for e in events)
    rows, open_spans = [], {}
    for e in events:
        who = (e.get("instance"), e.get("attempt"))
        if e["kind"] in ("assigned", "revoked"):
            owned = set(e["owned"])
            for p in list(open_spans):
                if p[0] == who and p[1] not in owned:
                    rows.append((*who, p[1], open_spans.pop(p), e["t"] - t0))
            for part in owned:
                open_spans.setdefault((who, part), e["t"] - t0)
        elif e["kind"] == "exited":
            for p in [p for p in open_spans if p[0] == who]:
                rows.append((*who, p[1], open_spans.pop(p), e["t"] - t0))
    end = max(e["t"] for e in events) - t0
    rows += [(*who, part, start, end) for (who, part), start in open_spans.items()]
    frame = pd.DataFrame(rows, columns=["instance", "attempt", "partition", "start", "end"])
    return frame.sort_values(["partition", "start"], ignore_index=True).round(2)


def rebalance_pause(events: list[dict]) -> float | None:
    """Seconds from the first killed instance's death to the first batch processed again
    from a partition it owned (by anyone): how long the group left that work undone."""
    deaths = [e for e in events if e["kind"] == "exited" and e["code"] == KILLED]
    if not deaths:
        return None
    death = deaths[0]
    who = (death["instance"], death["attempt"])
    held: set[int] = set()
    for e in events:
        if e["t"] > death["t"]:
            break
        if (e.get("instance"), e.get("attempt")) == who and e["kind"] in ("assigned", "revoked"):
            held = set(e["owned"])
    again = [e for e in events if e["kind"] == "processed" and e["t"] > death["t"]
             and held & set(e["partitions"])]
    return round(again[0]["t"] - death["t"], 2) if again else None


@dataclass(frozen=True)
class Takeover:
    """How the group got over the first killed instance (plain data for a notebook line)."""

    killed: str  # the instance
    held: tuple[int, ...]  # the partitions it owned when it died
    pause_s: float | None  # death -> first batch processed again from ``held``
    rejoined: bool  # did its restart get partitions again?
    survivor_left_idle: bool  # did a live instance own nothing for a while meanwhile?


def takeover(events: list[dict]) -> Takeover | None:
    deaths = [e for e in events if e["kind"] == "exited" and e["code"] == KILLED]
    if not deaths:
        return None
    death = deaths[0]
    dead = (death["instance"], death["attempt"])
    owned: dict[tuple, set[int]] = {}
    held: set[int] = set()
    idle = False
    pause = rebalance_pause(events)
    end = death["t"] + (pause or 0.0)
    for e in events:
        who = (e.get("instance"), e.get("attempt"))
        if e["kind"] not in ("assigned", "revoked"):
            continue
        owned[who] = set(e["owned"])
        if who == dead and e["t"] <= death["t"]:
            held = owned[who]
        if death["t"] < e["t"] <= end and who[0] != dead[0] and not owned[who]:
            idle = True
    rejoined = any(e["kind"] == "assigned" and e["owned"] and e.get("instance") == dead[0]
                   and e.get("attempt", 0) > dead[1] for e in events)
    return Takeover(dead[0], tuple(sorted(held)), pause, rejoined, idle)


# ------------------------------------------------------------ a tortured app (labkit.torture.harness)
# The harness writes "started", "killed", "stopped" (and "broker-killed"/"broker-restarted")
# when it acts, and "progress" when Kafka shows the app got further: the offsets its group
# committed on the input, the input's end, the records in the output (high watermark).

FAULT_KINDS = ("started", "killed", "stopped", "broker-killed", "broker-restarted")


def torture_progress(events: list[dict]) -> pd.DataFrame:
    """One row per "progress" event: seconds from the run's first event, offsets committed by
    the app's group, the input's end, output records (aborted transactions' included)."""
    t0 = min((e["t"] for e in events), default=0.0)
    rows = [(round(e["t"] - t0, 2), e["committed"], e["end"], e["output"])
            for e in events if e["kind"] == "progress"]
    return pd.DataFrame(rows, columns=["t", "committed", "end", "output"])


def torture_faults(events: list[dict]) -> pd.DataFrame:
    """One row per thing the harness did (start, kill, final stop, broker kill/restart):
    seconds from the run's first event, kind, the app's start number."""
    t0 = min((e["t"] for e in events), default=0.0)
    rows = [(round(e["t"] - t0, 2), e["kind"], e.get("attempt"))
            for e in events if e["kind"] in FAULT_KINDS]
    return pd.DataFrame(rows, columns=["t", "kind", "attempt"])


@dataclass(frozen=True)
class TortureStory:
    """A tortured run in numbers a notebook line can state."""

    starts: int
    kills: int
    committed: int  # the group's last committed offsets (summed over partitions)
    end: int  # the input's end offsets (summed)
    commits_seen: int  # how often the committed offsets moved forward, as sampled
    output: int  # output records at the end (aborted ones included)


def torture_story(events: list[dict]) -> TortureStory:
    progress = torture_progress(events)
    kinds = [e["kind"] for e in events]
    last = progress.iloc[-1] if len(progress) else None
    moves = int((progress["committed"].diff().fillna(progress["committed"]) > 0).sum())
    return TortureStory(starts=kinds.count("started"), kills=kinds.count("killed"),
                        committed=int(last["committed"]) if last is not None else 0,
                        end=int(last["end"]) if last is not None else 0,
                        commits_seen=moves,
                        output=int(last["output"]) if last is not None else 0)


def text(events: list[dict]) -> str:
    """A run's history as its timeline: one line per event, seconds since the first event,
    who (an instance, or the supervisor), what, and the event's details."""
    events = [e for e in events if e.get("kind") not in history.RUNNER_KINDS]
    if not events:
        return ""
    start = events[0]["t"]
    lines = []
    for event in events:
        who = f"instance {event['instance']}" if event.get("instance") is not None else "supervisor"
        details = ", ".join(f"{k}={v}" for k, v in event.items()
                            if k not in ("t", "kind", "instance", "pid"))
        lines.append(f"{event['t'] - start:5.1f} s  {who:<11} {event['kind']}"
                     + (f" ({details})" if details else ""))
    return "\n".join(lines)
