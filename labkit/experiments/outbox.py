"""The outbox read by Debezium on a real Kafka Connect worker, the worker SIGKILLed while it
streams: at-least-once sends again what came after its stored offsets, exactly-once source
support (KIP-618) keeps each event once.

    run = experiments.run("outbox", exactly_once=False)
    run.report.duplicated == len(run.sent_by_killed)     # all it sent after its offsets, twice
    run.stored_at_kill, run.slot_at_kill, run.open_before_kill   # what was kept where

A composition: the Connect worker, the service's schema and Debezium's slot are its db
part (``System``: set up before the clients, torn down after the audit), the service and
the connector its clients (``Outbox``), the worker's SIGKILL is a ``Kill`` fault fired by the event the clients report once
``kill_after`` events of the second part are in the topic, the audit of the events topic
is the checker. The run: a worker of its own (its group and three topics), the service's
tables in a PostgreSQL schema of the run's own, Debezium's slot; ``first`` payments written
and streamed, then the connector stopped and resumed (a stopping task writes its offsets,
so the stored position is a known one); then the service writes ``second`` payments at
``rate`` a second in a thread that goes on through the kill; the killed worker is started
again (its offsets written every second from then on) and stopped once everything is in
the topic and committed. Everything is removed after.
"""
from __future__ import annotations

import time
from typing import Any

from labkit.checking.checks import TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.faults.nemesis import Nemesis, on
from labkit.faults.process_faults import Kill
from labkit.kafka import connect, topics
from labkit.kafka.connect import ConnectWorker
from labkit.kafka.inspect import Inspector
from labkit.pipelines import data, outbox
from labkit.storage.debezium import OutboxSource, pg_name
from labkit.storage import postgres

NAME = "outbox"
KILLED = "SIGKILL the Connect worker"
VISIBLE_TIMEOUT_S = 60.0
# The restarted worker's offset.flush.interval.ms (an exactly-once connector's transaction
# interval defaults to it): its re-sent records are committed while it runs. The run does
# not count on the clean stop to commit them: once in about 20 runs a SIGTERM right after
# the re-send ended with that transaction aborted, not committed (docs/measurements.md).
RESTART_COMMIT_INTERVAL_MS = 1000


def count(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> int:
    return len(topics.read(bootstrap, topic, isolation=isolation))


def wait_count(bootstrap: str, topic: str, n: int, timeout_s: float = VISIBLE_TIMEOUT_S,
               isolation: str = "read_uncommitted") -> int:
    """Until ``topic`` holds at least ``n`` records (read_uncommitted: sent, committed or not);
    how many it holds then (fewer after ``timeout_s``: the audit will say what is missing)."""
    deadline = time.monotonic() + timeout_s
    while (seen := count(bootstrap, topic, isolation)) < n and time.monotonic() < deadline:
        time.sleep(0.3)
    return seen


class System:
    """The outbox's db part: a Connect worker, and in a PostgreSQL schema of the run's own the
    service's tables, Debezium's publication and slot; all gone after the run."""

    def __init__(self, o: Any):
        self.o = o
        self.worker: ConnectWorker | None = None
        self.source: OutboxSource | None = None
        self.name = self.server = self.dsn = ""

    def setup(self, run: Any) -> None:
        o = self.o
        # the worker's JVM starts first: PostgreSQL is made ready while it does
        self.worker = ConnectWorker(run.bootstrap, run.base, exactly_once=o.exactly_once,
                                    commit_interval_ms=o.commit_interval_ms,
                                    home=run.workdir / "connect")
        run.owns(self.worker.names.configs, self.worker.names.offsets,
                 self.worker.names.statuses)
        self.worker.start(wait=False)
        self.name, self.server = postgres.name_for(run.base), postgres.ensure()
        self.dsn = postgres.fresh_schema(self.name, self.server)
        self.source = OutboxSource(run.base, self.dsn, run.topics["events"],
                                   slot=pg_name(run.base), publication=f"{pg_name(run.base)}_pub",
                                   schema=self.name)
        outbox.create_tables(self.dsn)
        self.source.prepare()
        run.step(f"PostgreSQL schema {self.name}: payments, outbox, publication and slot "
                 f"{self.source.slot}")

    def teardown(self, run: Any) -> None:
        # the worker first (its data is thrown away: no graceful stop needed), before the
        # slot goes: Debezium would make it again
        undo = [self.worker and self.worker.kill, self.source and self.source.drop,
                self.name and (lambda: postgres.drop_schema(self.name, self.server))]
        first: BaseException | None = None
        for step in filter(None, undo):
            try:
                step()
            except BaseException as exc:  # the rest is undone all the same
                first = first or exc
        if first is not None:
            raise first


class Outbox:
    """The clients: the service writing payments and its outbox rows, the connector on the
    run's Connect worker (``System``). To the process faults it is one instance, 0: the
    worker (``kill``)."""

    def attach(self, run: Any) -> None:
        self.run, o, system = run, run.o, run.db
        self.worker, self.source, self.dsn = system.worker, system.source, system.dsn
        self.service = outbox.PacedService(self.dsn, run.inputs[o.first:], o.rate)
        run.on_close(self.service.stop)
        run.workers = self

    # -- the process faults' view of it ---------------------------------------------------
    instances = (0,)

    def running(self, instance: int) -> bool:
        return self.worker.alive

    def kill(self, instance: int) -> bool:
        alive = self.worker.alive
        self.worker.kill()
        return alive

    # -- the run ----------------------------------------------------------------------------
    def __call__(self, run: Any) -> None:
        o, worker, source = run.o, self.worker, self.source
        events = run.topics["events"]
        worker.ready()
        run.observe(start_s=worker.startup_s, source=source, worker_names=worker.names)
        run.step(f"Connect worker ready in {worker.startup_s} s ("
                 f"{'exactly-once' if o.exactly_once else 'at-least-once'} sources)")
        worker.rest.create(source.name, source.connector_config(exactly_once=o.exactly_once))
        worker.rest.wait_running(source.name)
        source.wait_streaming()
        run.step("Debezium's connector streams from the slot")
        if o.first:
            outbox.write(self.dsn, run.inputs[:o.first])
            wait_count(run.bootstrap, events, o.first)
            worker.rest.stop(source.name)  # its task writes its offsets as it stops
            self._wait_stopped()
            worker.rest.resume(source.name)
            worker.rest.wait_running(source.name)
            source.wait_streaming()
            run.step(f"{o.first} events in the topic; the connector stopped (its offsets "
                     "written) and resumed")
        self.service.start()
        wait_count(run.bootstrap, events, o.first + o.kill_after)
        run.observe(rest_before_kill=worker.rest.offsets(source.name),
                    open_before_kill=connect.transactions(run.bootstrap, worker.names,
                                                          source.name, ("Ongoing",)))
        with Inspector(run.bootstrap) as inspector:
            run.observe(producers_before_kill=inspector.producers(events))
        run.event("streamed", events=o.first + o.kill_after)  # the kill fires here
        if not worker.alive:
            self._restart(run)
        self.service.join()
        # Debezium sends again what came after its stored position, then the rest; an
        # exactly-once task commits them at its next transaction boundary
        sent = run.facts.get("sent_by_killed", [])
        after = wait_count(run.bootstrap, events, o.first + len(sent) + o.second)
        run.observe(resent=after - o.first - o.second)
        wait_count(run.bootstrap, events, o.first + o.second, isolation="read_committed")
        worker.stop()
        run.step("everything in the topic and committed; the worker stopped")
        run.observe(stored_after=connect.stored_offsets(run.bootstrap, worker.names,
                                                        source.name),
                    resume_lines=worker.log_lines("WAL") + worker.log_lines("no previous LSN"),
                    committed=topics.read(run.bootstrap, events))

    def _restart(self, run: Any) -> None:
        """What was kept when it died (read after the kill: a commit just before it counts),
        what it had sent after that, then the worker started again."""
        worker, killed = self.worker, time.monotonic()
        run.observe(
            stored_at_kill=connect.stored_offsets(run.bootstrap, worker.names, self.source.name),
            slot_at_kill=self.source.slot_state(),
            sent_by_killed=[r.value["id"] for r in topics.read(
                run.bootstrap, run.topics["events"], isolation="read_uncommitted")][run.o.first:],
            open_after_kill=connect.transactions(run.bootstrap, worker.names,
                                                 self.source.name, ("Ongoing",)))
        # The long interval only had to hold the kill inside its window; now the run need
        # not wait a minute for the next commit.
        worker.commit_interval_ms = RESTART_COMMIT_INTERVAL_MS
        worker.start()
        restart_s = round(time.monotonic() - killed, 1)
        run.observe(restart_s=restart_s)
        worker.rest.wait_running(self.source.name)
        run.step(f"the worker started again {restart_s} s after the kill")

    def _wait_stopped(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.worker.rest.status(self.source.name)["connector"]["state"] != "STOPPED":
            if time.monotonic() > deadline:
                raise TimeoutError(f"connector {self.source.name} did not stop: "
                                   f"{self.worker.rest.status(self.source.name)}")
            time.sleep(0.2)


def _check(second, kill_after, **_) -> None:
    if kill_after > second:
        raise ValueError(f"kill_after must be at most second ({second}): the worker is killed "
                         f"once that many of the second part's events are in the topic, not "
                         f"{kill_after}")


def _summary(run) -> str:
    lines = [run.report.summary()]
    if run.facts.get("restart_s") is not None:
        lines.append(f"  the killed worker had sent {len(run.sent_by_killed)} events after its "
                     f"stored offsets; {run.resent} were sent again after the restart")
    return "\n".join(lines)


register(Experiment(
    NAME, "the outbox read by Debezium on a Kafka Connect worker, SIGKILLed while it streams: "
    "at-least-once or exactly-once sources (KIP-618)", group="Kafka Connect", stall_after=180.0,
    options=(
        Option("exactly_once", REQUIRED, "the worker's exactly.once.source.support, and the "
               "connector asking for it", kind=bool),
        Option("kill", True, "SIGKILL the worker once kill_after events of the second part "
               "are in the topic", kind=bool),
        Option("first", 50, "payments streamed before the connector is stopped and resumed "
               "(its offsets written there)", kind=int, minimum=0),
        Option("second", 150, "payments the service writes after that, through the kill",
               kind=int, minimum=1),
        Option("rate", 100.0, "the second part's payments a second", kind=float, minimum=1),
        Option("kill_after", 50, "events of the second part in the topic when the worker is "
               "killed", kind=int, minimum=1),
        Option("commit_interval_ms", connect.DEFAULT_COMMIT_INTERVAL_MS, "offset.flush."
               "interval.ms until the kill (Kafka's default: a minute)", kind=int, minimum=100),
        common.keep_topics(False)),
    check=_check,
    workload=lambda o: Workload(f"outbox-{'eos' if o.exactly_once else 'alos'}",
                                (Topic("events"),), data.generate(o.first + o.second,
                                                                  seed=0)),
    db=System, clients=lambda run: Outbox(),
    nemesis=lambda o: Nemesis(*([Kill(0, on("streamed"), name=KILLED)] if o.kill else [])),
    checkers=lambda o: [TopicAudit(NAME, "exactly_once" if o.exactly_once else
                                   "at_least_once", fault=KILLED if o.kill else None,
                                   role="events")],
    presentation=Presentation(summary=_summary, json_facts=(
        "start_s", "restart_s", "resent"))))
