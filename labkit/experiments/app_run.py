"""An app the lab did not write, as an experiment's clients: its command run as supervised
processes (``labkit.faults.pool``, one process group per start), restarted when killed or
when it dies by itself, watched as Kafka shows its progress (its group's committed offsets,
the output's size: ``labkit.checking.group_progress``), and stopped once its input is
consumed and its output quiet.

A slow app is not a stalled one. An app alive, its input not consumed, that neither commits
offsets nor writes output for ``stall_s`` is *stalled* (a client call blocking far past its
own timeout, e.g. librdkafka's send_offsets_to_transaction() after a broker restart:
librdkafka #5456, #5511) and restarted like a killed one, unless its group says it is
waiting: rebalancing, or holding a member the app no longer runs (a killed instance whose
session has not timed out: 45 s by default); or the cluster says so: a restarted broker's
replicas not yet back in sync, a transaction on the input still open. That wait is recorded
as such, never as a stall.

A judge (``idle_s``) also tells an idle app from a stalled one: once the input is all there
and every fault has landed, an app whose committed offsets and output have not moved for
``idle_s`` while its group hands out work is restarted once; if it comes back and commits
no further, it has done what it will do (it commits less than it read: an off-by-one) and
its output is audited as it is, the offsets it left behind a finding (``behind``). With
``audit_stalled`` an app that stalls at every start, or is not done in ``timeout_s``, is
audited as it is too, not refused (a judge owes every loop a verdict).
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from labkit.checking import history
from labkit.checking.group_progress import GroupProgress
from labkit.experiments.stall_clock import Progress, Quiet, Stall
from labkit.faults.broker_faults import KillBroker
from labkit.faults.pool import WorkerPool
from labkit.faults.process_faults import Kill
from labkit.faults.schedule import Schedule
from labkit.pipelines.contract import ENV_BOOTSTRAP, ENV_INPUT, ENV_OUTPUT, HarnessError
from labkit.progress import status

QUIET_S = 2.0  # output unchanged this long (and the input consumed): the app is done
# An app that never commits offsets to LABKIT_GROUP_ID cannot show it consumed the input:
# for it, output unchanged this long counts as done (longer than a JVM's restart).
IDLE_S = 10.0
OWN_CRASHES = 3  # an app that dies by itself this often is broken, not unlucky
# Longer than an app's time between commits (quixstreams commits every 5 s by default), a
# JVM app's restart, IDLE_S, and a client call's own bound: a right app was called stalled
# at 30 s inside send_offsets_to_transaction(timeout 60 s) after a lost produce ack; let
# be, such a run stood still 46 s and went on by itself (the Java client's max.block.ms is
# 60 s too; docs/measurements.md, "Stop 48").
STALL_S = 70.0
MAX_STALLS = 3  # stalled this often in one run: it stalls every time it is started
STACKS_KEPT = 6000  # characters of a stalled app's stacks the history keeps


class AppClients:
    """``instances`` processes of ``command`` with the contract's environment ``env()``, or
    of a Python ``worker`` function with each instance's ``members[i]`` settings (``env()``
    then gives the settings every instance shares, e.g. its bootstrap). ``feed(run)``, if
    given, runs in a thread of its own while they run (input arriving as they work): the run
    is done only once it has returned. ``restart_exited``: an instance that exits (code 0)
    before its input is consumed is started again, as a supervisor with restart policy
    "always" would. ``progress(run)``: how its progress shows (default: its group's
    committed offsets and the output topic, ``GroupProgress``; an app writing to a database:
    ``labkit.checking.table_progress.TableProgress``). Its instances' starts and exits are
    the run's events (``instance-started``, ``instance-exited``), which faults may wait for.
    ``quiet_s``: how long its output stays the same, its input consumed, before it is done."""

    def __init__(self, command: list[str] | None, env: Callable[[], dict[str, str]], *,
                 worker: Callable | str | None = None, members: list[dict] | None = None,
                 instances: int = 1, timeout_s: float = 120.0, stall_s: float = STALL_S,
                 label: str = "", feed: Callable[[Any], None] | None = None,
                 restart_exited: bool = False,
                 on_done: Callable[[Any], str | None] | None = None,
                 own_crashes: int = OWN_CRASHES,
                 progress: Callable[[Any], GroupProgress] | None = None,
                 quiet_s: float = QUIET_S, idle_s: float | None = None,
                 audit_stalled: bool = False):
        self.command, self.env, self.worker = command, env, worker
        self.progress, self.quiet_s = progress, quiet_s
        self.members = members or [{} for _ in range(instances)]
        self.instances = len(self.members)
        self.feed, self.restart_after_exit, self.on_done = feed, restart_exited, on_done
        self._feeder: threading.Thread | None = None
        self._fed_at: float | None = None
        self._feed_error: list[BaseException] = []
        self.timeout_s, self.stall_s = timeout_s, stall_s
        self.label = label or (command[0] if command else str(worker))
        self.stalls: list[Stall] = []
        self.notes: list[str] = []
        self.waited: list[str] = []  # why the group made it wait (slow, not stalled)
        self.own_crashes = 0
        # how many exits with an error (not kills) before the run is called off; a judge
        # that counts them as findings allows more (and any before the first output)
        self.own_crash_limit = own_crashes
        self.done = False
        self.seconds = 0.0
        self.idle_s, self.audit_stalled = idle_s, audit_stalled
        self.behind: tuple[int, int] | None = None  # (committed, end) it stopped at
        self.final: tuple[int, int, int] | None = None  # (committed, end, output) at the end
        self._went_on = False  # once done, went on after ``on_done`` removed a wait
        self._stalls_before = 0  # stalls before it went on: the next one is its own

    def attach(self, run: Any) -> None:
        self.run = run
        self.watch = self.progress(run) if self.progress is not None else GroupProgress(
            run.bootstrap, run.topics["input"], run.topics["output"], run.group_id,
            history_file=run.history_file)
        run.progress = self.watch
        self.pool = WorkerPool(self.worker, self.members, command=self.command,
                               logs_dir=run.workdir, history_file=str(run.history_file),
                               label=self.label, max_attempts=10_000,
                               timeout_s=self.timeout_s + 60,
                               restart_failed=self._crashed_by_itself, on_tick=self._tick,
                               restart_exited=self._not_done if self.restart_after_exit
                               else None,
                               on_event=lambda kind, fields: run.event(kind, **fields))
        run.workers = self.pool

    # ------------------------------------------------------------------ the run

    def __call__(self, run: Any) -> None:
        self.started = time.monotonic()
        self.moving = Progress(self.started)
        self.quiet = Quiet()
        self.schedule = next(iter(run.nemesis.of(Schedule)), None)
        self._faults_seen = 0
        self.pool.defaults = self.env()  # the contract's environment, a proxy's bootstrap in it
        if self.feed is not None:
            self._feeder = threading.Thread(target=self._feed, args=(run,), name="feed",
                                            daemon=True)
            self._feeder.start()
        try:
            with status(f"torture: {self.label}") as say:
                self.say = say
                self.pool.run()
                while not self.done:  # every instance exited by itself (code 0)
                    self._after_exit()
                    time.sleep(0.1)
        finally:
            self.watch.__exit__()
            self.seconds = round(time.monotonic() - self.started, 2)
            if self._feeder is not None:
                self._feeder.join()
        if self._feed_error:
            raise self._feed_error[0]

    def _feed(self, run: Any) -> None:
        try:
            self.feed(run)
        except BaseException as exc:  # raised in the run's thread
            self._feed_error.append(exc)

    @property
    def feeding(self) -> bool:
        return self._feeder is not None and self._feeder.is_alive()

    def _not_done(self, instance: int) -> bool:
        consumed, end, _ = self.watch.sample(fresh=True)
        return self.feeding or consumed < end

    def restart_s(self) -> list[float]:
        """For each kill, the seconds from the SIGKILL to the instance running again."""
        events = history.read(self.run.history_file)
        gaps, killed = [], {}
        for e in events:
            if e["kind"] == "killed":
                killed[e.get("instance")] = e["t"]
            elif e["kind"] == "started" and e.get("instance") in killed:
                gaps.append(round(e["t"] - killed.pop(e.get("instance")), 4))
        return gaps

    def _tick(self, pool: WorkerPool) -> None:
        if self.done:
            return
        consumed, end, written = self._sample()
        if time.monotonic() - self.started > self.timeout_s:
            if not (self.audit_stalled and written):
                raise HarnessError(self._timeout_message(consumed, end, written))
            self.notes.append(self._timeout_message(consumed, end, written).split("\n")[0]
                              + ": its output audited as it is")
            if self.schedule is not None and self.schedule.pending:
                self._unlanded("ran out of time", "")
            self._finish()
            return
        alive = sum(pool.running(i) for i in range(len(pool.instances)))
        stalled_s = self.moving.stalled_s(consumed, end, written,
                                          (pool.result.attempts, self._faults_seen))
        if alive and stalled_s >= self._stall_after() and self.watch.ok:
            why = self._frozen() or self.watch.waiting(alive)
            if why is None:
                if len(self.stalls) > self._stalls_before and (
                        self.stalls[-1].consumed, self.stalls[-1].end) == (consumed, end) \
                        and self.idle_s is not None:
                    self._stopped_behind(consumed, end)  # a restart did not move it on
                else:
                    self._restart_stalled(stalled_s)
                return
            self.moving.since = time.monotonic()  # a wait is not a stall: counted afresh
            if not self.waited or self.waited[-1] != why:
                self.waited.append(why)
                self.run.step(f"torture: no progress for {stalled_s:.0f} s, but {why}: "
                              "slow, not stalled")
        if self.feeding:
            self._fed_at = None
            self.quiet.still(written, 0)
            return
        if self.feed is not None and self._fed_at is None:  # the input is all written now:
            self._fed_at = time.monotonic()  # what was sampled before does not count
            self.quiet = Quiet()
            consumed, end, written = self.watch.sample(fresh=True)
        pending = self.schedule is not None and self.schedule.pending
        if not self.watch.ok:  # old numbers (the broker did not answer): nothing decided
            return
        if pending and self.schedule.waiting_for_commit and consumed >= end \
                and self.quiet.still(written, self.quiet_s):
            self._unlanded("had consumed its input", "before it committed again")
            self._finish()
        elif not pending:
            if consumed >= end and self.quiet.still(written, self.quiet_s):
                self._finish()
            elif written and consumed == 0 and self.quiet.still(written, IDLE_S) \
                    and not self._group_waits(alive):
                self.notes.append(f"the input was not consumed by group {self.watch.group} "
                                  f"({consumed}/{end} offsets committed), but the output has "
                                  f"been quiet for {IDLE_S:.0f} s: audited as it is")
                self._finish()
        self.quiet.still(written, 0)

    def _group_waits(self, alive: int) -> bool:
        """Does the app's group say it is waiting (a dead member's session, a rebalance)?
        Then a quiet output is a slow app, not one that never commits: said, and the quiet
        counts afresh."""
        why = self._frozen() or self.watch.waiting(alive)
        if why is not None:
            self.quiet = Quiet()
            if not self.waited or self.waited[-1] != why:
                self.waited.append(why)
                self.run.step(f"torture: output quiet and nothing committed, but {why}: "
                              "slow, not stalled")
        return why is not None

    def _frozen(self) -> str | None:
        """An instance the nemesis froze (a zombie): its partitions wait for its session."""
        frozen = [i for i in range(len(self.pool.instances)) if self.pool.frozen(i)]
        return (f"instance {frozen[0]} is frozen: its partitions wait until its session "
                "times out" if frozen else None)

    def _stall_after(self) -> float:
        """Seconds without progress that make a stall: ``idle_s`` once the input is all
        there and no fault is still to land (nothing more will move the app on)."""
        pending = self.schedule is not None and self.schedule.pending \
            and not self.schedule.waiting_for_commit
        if self.idle_s is None or self.feeding or pending:
            return self.stall_s
        return min(self.idle_s, self.stall_s)

    def _stopped_behind(self, consumed: int, end: int) -> None:
        self.behind = (consumed, end)
        self._record_cluster()
        if self.schedule is not None and self.schedule.pending:
            self._unlanded("stopped committing", "")
        self.notes.append(f"the app stopped committing at {consumed} of {end} input offsets, "
                          "and again after a restart: its output audited as it is")
        self.run.step(f"torture: committed offsets stopped at {consumed} of {end}, again "
                      "after a restart: done")
        self._finish()

    def _after_exit(self) -> None:
        """The app finished by itself: audited once its output is quiet."""
        consumed, end, written = self._sample()
        if written == 0 and consumed == 0:
            raise HarnessError(f"the app exited (code 0) without consuming {self.watch.input} "
                               f"or writing to {self.watch.output}: it must read "
                               f"${ENV_INPUT} and write ${ENV_OUTPUT}. Its last lines:\n"
                               f"{self._tail()}")
        if self.schedule is not None and self.schedule.pending:
            self._unlanded("finished", "")
        if self.quiet.still(written, self.quiet_s):
            self.done = True
            if self.on_done is not None:
                self.on_done(self.run)

    def _sample(self) -> tuple[int, int, int]:
        fresh = self.schedule is not None and self.schedule.waiting_for_commit
        consumed, end, written = self.watch.sample(fresh=fresh)
        if self.schedule is not None and len(self.schedule.done) != self._faults_seen:
            self._faults_seen = len(self.schedule.done)
            self.quiet = Quiet()  # a fault: the output's quiet counts again from now
        self.say(self._line(consumed, end, written))
        return consumed, end, written

    def _line(self, consumed: int, end: int, written: int) -> str:
        """The progress line: the faults injected so far, the input consumed, the output."""
        planned = [*self.schedule.done, *self.schedule.remaining] if self.schedule else []
        done = self.schedule.done if self.schedule else []
        counts = [f"{what} {sum(isinstance(f, kind) for f in done)}/"
                  f"{sum(isinstance(f, kind) for f in planned)}"
                  for what, kind in (("kills", Kill), ("broker kills", KillBroker))]
        return (f"torture: {', '.join(counts)}, input consumed {consumed}/{end}, output "
                f"{written} records")

    def _finish(self) -> None:
        self.final = self.watch.sample(fresh=True)
        history.append(self.run.history_file, "finished", running=self._running())
        # before anything is stopped: e.g. what is still open. An ``on_done`` that removed
        # what the app waited for (a dead instance's transaction, holding back the offsets
        # its successor must read) says so: an app short of its input's end goes on, once
        waited_for = self.on_done(self.run) if self.on_done is not None else None
        if waited_for and not self._went_on and self.final[0] < self.final[1]:
            self._went_on, self._stalls_before = True, len(self.stalls)
            self.moving, self.quiet = Progress(time.monotonic()), Quiet()
            self.waited.append(waited_for)
            self.run.step(f"torture: it was waiting: {waited_for}; it goes on")
            return
        self.done = True
        self.pool.finish()

    def _unlanded(self, what: str, when: str) -> None:
        left = self.schedule.cancel()
        did = len(self.schedule.done)
        self.notes.append(f"the app {what} after {did} of {did + len(left)} fault(s)"
                          + (f", {when}" if when else "") + ": give it more input (--input) "
                          "or fault it sooner so every fault lands")

    def _crashed_by_itself(self, instance: int, code: int, tail: str) -> None:
        """An exit with an error, not a kill: restarted as a supervisor would (it has worked
        before), unless it never wrote anything or keeps doing it."""
        self.own_crashes += 1
        written = self.watch.last[2]
        first_is_fatal = self.own_crash_limit == OWN_CRASHES and written == 0
        if first_is_fatal or self.own_crashes >= self.own_crash_limit:
            raise HarnessError(f"the app exited with code {code} by itself (not killed by the "
                               f"harness; {self.own_crashes} time(s)) after writing {written} "
                               f"output records. Its last lines:\n{tail}")

    def _restart_stalled(self, stalled_s: float) -> None:
        consumed, end, written = self.moving.seen
        stall = Stall(after_s=round(self.moving.since - self.started, 1),
                      stalled_s=round(stalled_s, 1), consumed=consumed, end=end,
                      written=written, attempt=self.pool.instances[0].attempts,
                      stacks=self._save_stacks(len(self.stalls) + 1))
        self.stalls.append(stall)
        history.append(self.run.history_file, "stalled", attempt=stall.attempt,
                       stalled_s=stall.stalled_s, committed=consumed, end=end, output=written,
                       running=self._running())  # each of them restarted below
        if len(self.stalls) >= MAX_STALLS and self.audit_stalled:
            self._stopped_behind(consumed, end)  # (which records the cluster)
            return
        self._record_cluster()
        if len(self.stalls) >= MAX_STALLS:
            raise HarnessError(
                f"the app stalls every time it is started: {len(self.stalls)} times in this run "
                f"it stayed alive but neither committed offsets to group {self.watch.group} nor "
                f"wrote to {self.watch.output} for {stall.stalled_s:.0f} s while its input was "
                f"not consumed (restarted after each). Last seen {stall.after_s:.1f} s into "
                f"the run: {consumed} of {end} input offsets committed, {written} output "
                "records. A client call that blocks past its timeout (e.g. librdkafka's "
                "send_offsets_to_transaction(), librdkafka #5456, #5511)? A slow app needs a "
                f"longer --stall-s. Its last lines:\n{self._tail()}")
        line = (f"torture: app stalled: no commit and no output for {stall.stalled_s:.0f} s "
                f"since t={stall.after_s:.1f} s; restarting it")
        self.say(line)
        print(line, file=sys.stderr, flush=True)  # stays above the spinner (rich redirects it)
        for i in range(len(self.pool.instances)):
            self.pool.kill(i)

    def _running(self) -> list[int]:
        return [i for i in range(len(self.pool.instances)) if self.pool.running(i)]

    def _record_cluster(self) -> None:
        """What the cluster said when the app was called stalled, into the history: a stall
        is judged from the run's record, even after its directory is gone."""
        history.append(self.run.history_file, "cluster", **self.watch.state())

    def _save_stacks(self, stall: int) -> str:
        """Each running instance's stacks before the restart kills it (what a stalled app
        was blocked in), in one file of the run's directory and (the first STACKS_KEPT
        characters) in the history; its path, "" if none were read."""
        dumps = [f"--- instance {i}\n{text}" for i in range(len(self.pool.instances))
                 if (text := self.pool.stacks(i))]
        if not dumps:
            return ""
        path = self.run.workdir / f"stall-{stall}.stacks.txt"
        path.write_text("\n".join(dumps), encoding="utf-8")
        history.append(self.run.history_file, "stacks", text="\n".join(dumps)[:STACKS_KEPT])
        return str(path)

    def _tail(self) -> str:
        return self.pool.log_tail(0) or "  | (no output)"

    def _timeout_message(self, consumed: int, end: int, written: int) -> str:
        w = self.watch
        if written == 0 and consumed == 0:
            what = (f"the input was not consumed within {self.timeout_s:.0f} s: the app wrote "
                    f"nothing to {w.output} and group {w.group} committed no offsets on "
                    f"{w.input}. Does it read ${ENV_INPUT} and write ${ENV_OUTPUT} "
                    f"(at ${ENV_BOOTSTRAP})?")
        elif consumed < end:
            what = (f"the input was not consumed within {self.timeout_s:.0f} s: group "
                    f"{w.group} committed {consumed} of {end} offsets; the output has "
                    f"{written} records. A slow app needs a longer --timeout; a stuck one, a "
                    "look at its log")
        else:
            what = (f"the output {w.output} did not go quiet within {self.timeout_s:.0f} s "
                    f"({written} records so far): does the app write more than once per input?")
        return f"{what}\nThe app's last lines:\n{self._tail()}"
