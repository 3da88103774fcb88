"""Crash a streaming query at a named point and restart it until it is done.

    run = run_until_done(job, crash_at="spark-after-sink-before-commit", hit=2)
    run.timeline          # one row per batch per attempt: which batch ran, which crashed
    run.attempts[0].checkpoint   # the checkpoint right after the crash

The first attempt runs in a fresh worker armed with the crash point (SIGKILL of the whole
worker: Python driver and, through the closed gateway pipe, its JVM). The restart runs on a
warm, unarmed worker (shared, to save a Spark start) from the same checkpoint; for
``resume="database"`` it starts a new checkpoint at the offsets the sink stored. A spare
fresh worker is started in the background for the next crash experiment.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from labkit import progress
from labkit.kafka import topics
from labkit.paths import spark_remote
from labkit.spark import checkpoint as ckpt
from labkit.spark.runner import (SPARK_CRASH_POINTS, SparkJobError, SparkWorker, StreamJob,
                                 fresh_worker, shared_worker)
from labkit.spark.sinks import create_tables, stored_offsets

@dataclass
class Attempt:
    number: int
    crash_at: str | None
    crashed: bool
    returncode: int | None
    seconds: float
    checkpoint_dir: str
    starting_offsets: str
    events: list[dict]
    checkpoint: pd.DataFrame = field(repr=False)  # ckpt.batches() right after the attempt
    jvm_exit_s: float | None = None  # how long the JVM took to die after a crash
    jvm_pid: int | None = None


@dataclass
class Run:
    job: StreamJob
    attempts: list[Attempt]

    @property
    def crashed(self) -> bool:
        return any(a.crashed for a in self.attempts)

    @property
    def timeline(self) -> pd.DataFrame:
        """One row per batch per attempt: rows, outcome, and whether it was a replay."""
        rows = []
        for a in self.attempts:
            committed = set(a.checkpoint.loc[a.checkpoint["committed"], "batch_id"])
            ends = {e["batch"]: e for e in a.events if e["event"] == "batch-end"}
            starts = [e for e in a.events if e["event"] == "batch-start"]
            for i, e in enumerate(starts):
                batch, end = e["batch"], ends.get(e["batch"])
                outcome = "committed" if batch in committed else "planned, not committed"
                if a.crashed and i == len(starts) - 1:  # the batch the crash hit
                    outcome = ("committed, then crashed" if batch in committed else
                               "sink done, crashed before commit" if end else "crashed in the sink")
                rows.append({"attempt": a.number, "batch_id": batch, "rows": e["rows"],
                             "outcome": outcome,
                             "skipped": ", ".join(end.get("skipped", [])) if end else ""})
        frame = pd.DataFrame(rows, columns=["attempt", "batch_id", "rows", "outcome", "skipped"])
        # A replay re-reads an offset range an earlier attempt already ran (batch ids
        # restart when the transactional sink resumes on a new checkpoint, ranges do not).
        earlier: set = set()
        replay = []
        for a in self.attempts:
            ranges = {b: tuple(map(tuple, g[["topic", "partition", "start_offset", "end_offset"]].values))
                      for b, g in a.checkpoint.groupby("batch_id")}
            ran = frame.loc[frame["attempt"] == a.number, "batch_id"]
            replay += [ranges.get(b) in earlier for b in ran]
            earlier |= {ranges.get(b) for b in ran}
        frame["replay"] = replay
        return frame


def database_offsets(job: StreamJob) -> str:
    """startingOffsets JSON from the transactional sink's table ("earliest" where none)."""
    stored = stored_offsets(job.sink)
    parts = topics.partitions_of(job.bootstrap, job.topic)
    return json.dumps({job.topic: {str(p): stored.get((job.topic, p), -2) for p in parts}})


def _start_of(job: StreamJob) -> dict[str, dict[int, int]] | None:
    """Where batch 0 began, for the checkpoint view (-2, "earliest", is offset 0 here)."""
    return ckpt.starting_positions(job.starting_offsets)


_said_local = False


def _say_local_driver() -> None:
    """Once per process: with LABKIT_SPARK_REMOTE set, a crash experiment still runs its
    query on a local driver (stderr, beside the progress lines; compared outputs stay alike)."""
    global _said_local
    if spark_remote() and not _said_local:
        _said_local = True
        print(f"LABKIT_SPARK_REMOTE={spark_remote()} is set, but crash experiments SIGKILL their "
              "Spark driver: they run on a local one (batch queries such as the recount run "
              "on the server)", file=sys.stderr)


def run_until_done(job: StreamJob, crash_at: str | None = None, hit: int = 1, *,
                   resume: str = "checkpoint", max_attempts: int = 3,
                   worker: SparkWorker | None = None, log_dir: str | Path | None = None,
                   on_event: Callable[[dict], None] | None = None, spare: bool = True,
                   on_attempt: Callable[[int, str | None], None] | None = None) -> Run:
    """Run ``job``, SIGKILLed at ``crash_at`` on its ``hit``-th visit, restarted until done.

    ``resume="checkpoint"``: every attempt uses ``job.checkpoint`` (Spark replays an
    uncommitted batch). ``resume="database"`` (transactional sink): each attempt starts a
    fresh checkpoint at the offsets stored in the sink's database. ``on_event`` sees every
    batch event as it happens, with its attempt number (for a live view). ``spare=False``:
    start no spare worker for a next crash experiment (see ``fresh_worker``).
    ``on_attempt(number, crash_at)`` is told each attempt as it starts (a run's timeline).
    """
    if crash_at is not None and crash_at not in SPARK_CRASH_POINTS:
        raise ValueError(f"crash point {crash_at!r} is not a Spark one; valid: "
                         f"{', '.join(SPARK_CRASH_POINTS)}")
    if resume not in ("checkpoint", "database"):
        raise ValueError(f"resume must be 'checkpoint' or 'database', not {resume!r}")
    if resume == "database" and job.sink.kind != "transactional":
        raise ValueError("resume='database' needs the transactional sink (it stores offsets)")
    create_tables(job.sink)
    _say_local_driver()
    attempts: list[Attempt] = []
    for number in range(1, max_attempts + 1):
        progress.check()  # a run its watchdog stopped starts no next attempt
        current = job
        if resume == "database":
            current = replace(job, checkpoint=str(Path(job.checkpoint) / f"attempt-{number}"),
                              starting_offsets=database_offsets(job))
        ckpt.claim(current.checkpoint, current.query, current.topic)
        armed = crash_at if number == 1 else None
        if on_attempt is not None:
            on_attempt(number, armed)
        tell = (lambda e, n=number: on_event({**e, "attempt": n})) if on_event else None
        if armed:
            with fresh_worker(log_dir, spare) as fresh:
                result = fresh.run(current.message(), armed, hit, on_event=tell)
            jvm_exit, jvm_pid = (fresh.jvm_exit_s if result.crashed else None), fresh.jvm_pid
            if result.crashed and tell:
                tell({"event": "crashed", "crash_at": armed})
        else:
            used = worker or shared_worker(log_dir)
            result = used.run(current.message(), on_event=tell)
            jvm_exit, jvm_pid = None, used.jvm_pid
        attempts.append(Attempt(number, armed, result.crashed, result.returncode, result.seconds,
                                current.checkpoint, current.starting_offsets, result.events,
                                ckpt.batches(current.checkpoint, _start_of(current)), jvm_exit,
                                jvm_pid))
        if not result.crashed:
            return Run(job, attempts)
    raise SparkJobError(f"the query crashed {max_attempts} times; see the attempts' events")
