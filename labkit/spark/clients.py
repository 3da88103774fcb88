"""A Spark query as an experiment's clients, and the fault that kills a driver from outside.

    clients = SparkQuery(job=lambda run, workdir: StreamJob(...), resume="checkpoint")
    nemesis = Nemesis(CrashAt("spark-after-sink-before-commit", hit=2))  # its 1st attempt
    nemesis = Nemesis(KillDriver(after(2.5, since=on("checkpoint"))))    # from outside

``SparkQuery`` is a crash-supervised streaming query (``labkit.spark.supervised``). Attached
to the run, it builds its job (the checkpoint and tables in the run's directory, or in the
``workdir`` given) and stands as the run's ``workers``: the nemesis's ``CrashAt`` arms its
crash point in the fresh Spark worker its first attempt runs in (Python driver and JVM
SIGKILLed together at that point). Run, it is restarted until the input is done. Each
attempt is a step of the run's timeline; each batch event (``batch-start``, ``batch-end``,
``crashed``) an event a fault may wait for (``on("crashed")``) and a line of the run's history.
Its facts: ``job`` (the StreamJob) and ``run`` (the attempts, their checkpoints, the timeline).

``KillDriver`` is for a query the lab kills at a moment of its choosing rather than at a
crash point (a real-time query mid-batch): the clients' ``kill(say)`` does it and says what
it left behind.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.faults.nemesis import Fault, Run as Broken, Trigger
from labkit.spark.runner import StreamJob
from labkit.spark.supervised import Run, run_until_done


@dataclass
class SparkQuery:
    """The query ``job(run, workdir)`` builds, run until done under the crash point armed in
    it (see the module's docstring). ``resume``: where a restart starts ("checkpoint", or
    "database": the transactional sink's offsets). ``spare=False``: no spare Spark worker
    started for a next crash. ``on_event``: every batch event, with its attempt number."""

    job: Callable[[Any, Path], StreamJob]
    resume: str = "checkpoint"
    spare: bool = True
    on_event: Callable[[dict], None] | None = None
    workdir: str | Path | None = None
    crash_at: str | None = None
    hit: int = 1
    built: StreamJob | None = None
    directory: Path | None = None

    def attach(self, run: Any) -> None:
        self.directory = Path(self.workdir) if self.workdir else run.workdir
        self.directory.mkdir(parents=True, exist_ok=True)
        self.built = self.job(run, self.directory)
        run.observe(job=self.built)
        run.workers = self  # where CrashAt arms its point

    def arm(self, instance: int, point: str, hit: int = 1, stall: bool = False) -> None:
        """A crash point for the query's first attempt (``CrashAt``'s way in)."""
        if instance != 0 or stall:
            raise ValueError("a Spark query is crashed in its first attempt (instance 0), by "
                             "a SIGKILL at the point: it cannot freeze there")
        self.crash_at, self.hit = point, hit

    def __call__(self, run: Any) -> Run:
        def attempt(number: int, armed: str | None) -> None:
            run.step(f"attempt {number}: " + (
                f"the query in a fresh Spark worker, armed to crash at {armed}" if armed else
                "the query restarted in the warm Spark worker" if number > 1 else
                "the query in the warm Spark worker"), "its micro-batches")

        def tell(event: dict) -> None:
            if self.on_event is not None:
                self.on_event(event)
            if event["event"] == "crashed":
                run.step(f"attempt {event['attempt']}: the driver SIGKILLed itself at "
                         f"{event['crash_at']}, its JVM with it", "the restart")
            run.event(event["event"], **{k: v for k, v in event.items() if k != "event"})

        # a live view (a notebook's dashboard) follows the run's topics while the query runs
        with run.watch(dict(run.topics)) if run.watch is not None else nullcontext():
            result = run_until_done(self.built, self.crash_at, self.hit, resume=self.resume,
                                    log_dir=self.directory, on_event=tell, spare=self.spare,
                                    on_attempt=attempt)
        run.step(f"attempt {len(result.attempts)} reached the input's end")
        run.observe(run=result)
        run.history = [{**e, "attempt": a.number} for a in result.attempts for e in a.events]
        return result


class KillDriver(Fault):
    """SIGKILL the clients' Spark driver (its Python process and JVM at once) from outside
    when ``trigger`` fires: ``run.clients.kill(say)`` kills it and says what it left (a step
    of the timeline; ``say``'s fields join the fault's history entry, for a checker that
    names the fault) before the clients go on."""

    name = "driver SIGKILLed"

    def __init__(self, trigger: Trigger):
        self.trigger = trigger

    def invoke(self, run: Broken) -> None:
        run.clients.kill(lambda what, **fields: run.fired(self, what, **fields))
