"""Supervising the app under test: start it, SIGKILL its process group (or the lab's broker)
at seeded times and start it again, as a supervisor would; watch its progress as Kafka shows
it (the group's committed offsets, the output's size); restart it when it stalls (alive, no
progress); return once its input is consumed and its output quiet."""
from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from labkit import proc

from labkit.checking import history
from labkit.kafka import cluster as lab
from labkit.kafka import topics
from labkit.kafka.clientlog import client_config
from labkit.torture.contract import ENV_BOOTSTRAP, ENV_INPUT, ENV_OUTPUT, HarnessError
from labkit.torture.result import Stall, TortureResult

# When a fault's seeded delay starts counting: at the app's (re)start, or at its first offset
# commit after it. "commit" puts every kill between two commits of the app, whatever its
# start took (a JVM may take seconds on a loaded machine, and a kill during its start hits
# nothing the app has processed): what it processed since that commit is in flight.
KILL_CLOCKS = ("start", "commit")
QUIET_S = 2.0  # output unchanged this long (and the input consumed): the app is done
# An app that never commits offsets to LABKIT_GROUP_ID cannot show it consumed the input:
# for it, output unchanged this long counts as done (longer than a JVM's restart).
IDLE_S = 10.0
OWN_CRASHES = 3  # an app that dies by itself this often is broken, not unlucky
# An app alive, its input not consumed, that neither commits offsets nor writes output this
# long is stalled: a client call blocking far past its own timeout, e.g. librdkafka's
# send_offsets_to_transaction() after a broker restart (librdkafka #5456, #5511). Waiting
# for the run's timeout would only turn a finding into a failure. Longer than an app's time
# between commits (quixstreams commits every 5 s by default), a JVM app's restart and IDLE_S.
STALL_S = 30.0
MAX_STALLS = 3  # stalled this often in one run: it stalls every time it is started
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long
LOG_TAIL_LINES = 15


def supervise(app: "App", watch: "Watch", cluster: lab.Cluster, result: TortureResult, *,
              kills: int, broker_kills: int, kill_after_s: tuple[float, float],
              timeout_s: float, seed: int, progress, started: float,
              kill_clock: str = "start", stall_s: float = STALL_S) -> None:
    """Start the app, inject the seeded faults, restart it (also when it stalls), return
    once it is done."""
    rng = random.Random(seed)
    faults = ["app"] * kills + ["broker"] * broker_kills
    rng.shuffle(faults)  # the seed decides the interleaving too

    def arm() -> tuple[float, float | None, int]:
        """The next fault's seeded delay, when it is due (None: at the app's next commit),
        and the group's committed offsets now (for kill_clock="commit")."""
        delay = rng.uniform(*kill_after_s)
        if kill_clock == "start":
            return delay, time.monotonic() + delay, 0
        watch.next_at = 0.0  # fresh: the killed app may have committed just before
        return delay, None, watch.sample()[0]

    app.start()
    delay, due, consumed_at_start = arm()
    own_crashes = 0
    quiet = _Quiet()
    moving = _Progress(started)
    while True:
        now = time.monotonic()
        if due is None:
            watch.next_at = 0.0  # waiting for the commit that starts the clock: sample now
        consumed, end, written = watch.sample()
        if due is None and consumed > consumed_at_start:
            due = now + delay
        progress(f"torture: kills {result.kills}/{kills}, broker kills "
                 f"{result.broker_kills}/{broker_kills}, input consumed {consumed}/{end}, "
                 f"output {written} records")
        if now - started > timeout_s:
            raise HarnessError(_timeout_message(timeout_s, consumed, end, written, watch, app))
        code = app.poll()
        if code is not None and code != 0:
            own_crashes += 1
            if written == 0 or own_crashes >= OWN_CRASHES:
                raise HarnessError(f"the app exited with code {code} by itself (not killed by "
                                   f"the harness; {own_crashes} time(s)) after writing "
                                   f"{written} output records. Its last lines:\n{app.tail()}")
            app.start()  # as a supervisor would: it has worked before
            result.restarts += 1
            continue
        if faults and code is None and due is not None and now >= due:
            if faults.pop(0) == "app":
                result.kills += 1
                result.restart_s.append(_kill_and_restart(app, result))
            else:
                progress(f"torture: SIGKILL the broker ({result.broker_kills + 1}/{broker_kills})")
                history.append(app.history, "broker-killed")
                cluster.kill()
                cluster.restart()
                result.broker_kills += 1
                history.append(app.history, "broker-restarted")
            delay, due, consumed_at_start = arm()
            quiet = _Quiet()
            continue
        # A new start of the app or of the broker starts the stall clock over.
        stalled_s = moving.stalled_s(consumed, end, written, (app.starts, result.broker_kills))
        if code is None and stalled_s >= stall_s:
            # The pending fault (if any) keeps its clock: the seeded schedule is unchanged.
            _restart_stalled(app, watch, result, moving, stalled_s, progress)
            quiet = _Quiet()
            continue
        if code == 0:  # the app finished by itself: no process left to fault
            if written == 0 and consumed == 0:
                raise HarnessError(f"the app exited (code 0) without consuming {watch.input} "
                                   f"or writing to {watch.output}: it must read "
                                   f"${ENV_INPUT} and write ${ENV_OUTPUT}. Its last "
                                   f"lines:\n{app.tail()}")
            if faults:
                result.notes.append(
                    f"the app finished after {result.kills} of {kills} kill(s) and "
                    f"{result.broker_kills} of {broker_kills} broker kill(s): give it more "
                    "input (--input) or kill sooner so every fault lands")
                faults.clear()
            if quiet.still(written, QUIET_S):
                return
        elif faults and due is None and consumed >= end and quiet.still(written, QUIET_S):
            # kill_clock="commit": the app was done before it committed again after a fault
            result.notes.append(
                f"the app had consumed its input after {result.kills} of {kills} kill(s) and "
                f"{result.broker_kills} of {broker_kills} broker kill(s), before it committed "
                "again: give it more input (--input) so every fault lands")
            faults.clear()
        elif not faults:
            if consumed >= end and quiet.still(written, QUIET_S):
                return
            if written and consumed == 0 and quiet.still(written, IDLE_S):
                result.notes.append(f"the input was not consumed by group {watch.group} "
                                    f"({consumed}/{end} offsets committed), but the output has "
                                    f"been quiet for {IDLE_S:.0f} s: audited as it is")
                return
        quiet.still(written, 0)
        time.sleep(0.1)


def _kill_and_restart(app: "App", result: TortureResult) -> float:
    """SIGKILL the app's process group and start it again, as a supervisor does; returns the
    seconds from the SIGKILL to the app running again."""
    t0 = time.monotonic()
    app.kill()
    app.start()
    result.restarts += 1
    return round(time.monotonic() - t0, 4)


def _restart_stalled(app: "App", watch: "Watch", result: TortureResult,
                     moving: "_Progress", stalled_s: float, progress) -> None:
    """Record the stall, say so, and restart the app; the MAX_STALLS-th raises HarnessError."""
    consumed, end, written = moving.seen
    stall = Stall(after_s=round(moving.since - moving.started, 1), stalled_s=round(stalled_s, 1),
                  consumed=consumed, end=end, written=written, attempt=app.starts)
    result.stalls.append(stall)
    history.append(app.history, "stalled", attempt=app.starts, stalled_s=stall.stalled_s,
                   committed=consumed, end=end, output=written)
    if len(result.stalls) >= MAX_STALLS:
        raise HarnessError(
            f"the app stalls every time it is started: {len(result.stalls)} times in this run "
            f"it stayed alive but neither committed offsets to group {watch.group} nor wrote "
            f"to {watch.output} for {stall.stalled_s:.0f} s while its input was not consumed "
            f"(restarted after each). Last seen {stall.after_s:.1f} s into the run: "
            f"{consumed} of {end} input offsets committed, {written} output records. A client "
            "call that blocks past its timeout (e.g. librdkafka's "
            "send_offsets_to_transaction(), librdkafka #5456, #5511)? A slow app needs a longer "
            f"--stall-after. Its last lines:\n{app.tail()}")
    line = (f"torture: app stalled: no commit and no output for {stall.stalled_s:.0f} s since "
            f"t={stall.after_s:.1f} s; restarting it")
    progress(line)
    print(line, file=sys.stderr, flush=True)  # stays above the spinner (rich redirects it)
    _kill_and_restart(app, result)


def _timeout_message(timeout_s: float, consumed: int, end: int, written: int,
                     watch: "Watch", app: "App") -> str:
    if written == 0 and consumed == 0:
        what = (f"the input was not consumed within {timeout_s:.0f} s: the app wrote nothing "
                f"to {watch.output} and group {watch.group} committed no offsets on "
                f"{watch.input}. Does it read ${ENV_INPUT} and write ${ENV_OUTPUT} "
                f"(at ${ENV_BOOTSTRAP})?")
    elif consumed < end:
        what = (f"the input was not consumed within {timeout_s:.0f} s: group {watch.group} "
                f"committed {consumed} of {end} offsets; the output has {written} records. "
                "A slow app needs a longer --timeout; a stuck one, a look at its log")
    else:
        what = (f"the output {watch.output} did not go quiet within {timeout_s:.0f} s "
                f"({written} records so far): does the app write more than once per input?")
    return f"{what}\nThe app's last lines:\n{app.tail()}"


class _Quiet:
    """Has a number stayed the same for a while? (the output's size, sampled)"""

    def __init__(self) -> None:
        self.value: int | None = None
        self.since = time.monotonic()

    def still(self, value: int, for_s: float) -> bool:
        if value != self.value:
            self.value, self.since = value, time.monotonic()
        return time.monotonic() - self.since >= for_s


class _Progress:
    """When did the app last make progress (its committed offsets or the output changed)?

    The clock starts over at each new ``epoch`` (a start of the app, a broker restart): a
    start takes its time before the first commit. Progress is only judged while the app has
    committed something and not yet its whole input: an app that never commits cannot show
    how far it got (IDLE_S covers it), and one that has consumed everything is finishing."""

    def __init__(self, started: float) -> None:
        self.started = started  # the run's start: stalls are reported relative to it
        self.seen: tuple[int, int, int] = (0, 0, 0)  # (consumed, end, written)
        self.epoch: object = None
        self.since = time.monotonic()

    def stalled_s(self, consumed: int, end: int, written: int, epoch: object) -> float:
        """Seconds without progress so far (0 while progress cannot be judged)."""
        now = time.monotonic()
        if epoch != self.epoch or (consumed, written) != (self.seen[0], self.seen[2]):
            self.epoch, self.since = epoch, now
        self.seen = (consumed, end, written)
        return now - self.since if 0 < consumed < end else 0.0


class Watch:
    """Progress as Kafka shows it: the group's committed offsets on the input, the input's
    end, the output's size (high watermark, open transactions included). Each change is a
    "progress" event in the run's history (``history_file``): the timeline of the app's
    commits and writes, as the broker saw them, next to the harness's kills."""

    def __init__(self, bootstrap: str, input_topic: str, output_topic: str, group: str,
                 history_file: Path | None = None):
        self.input, self.output, self.group = input_topic, output_topic, group
        self.history_file = history_file
        # Same group id as the app, but this consumer never subscribes or commits: it only
        # asks the coordinator for the committed offsets, which does not join the group.
        self.consumer = Consumer(client_config({
            "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "log_level": 0}))  # connection-refused noise while a broker restarts
        self.in_parts = [TopicPartition(input_topic, p)
                         for p in topics.partitions_of(bootstrap, input_topic)]
        self.out_parts = [TopicPartition(output_topic, p)
                          for p in topics.partitions_of(bootstrap, output_topic)]
        self.last = (0, sum(self._end(tp) for tp in self.in_parts), 0)
        self.next_at = 0.0

    def _end(self, tp: TopicPartition) -> int:
        return self.consumer.get_watermark_offsets(tp, timeout=2, cached=False)[1]

    def sample(self) -> tuple[int, int, int]:
        """(offsets committed, input end, output records); at most twice a second, and the
        last answer while the broker cannot say (it may be restarting)."""
        if time.monotonic() < self.next_at:
            return self.last
        self.next_at = time.monotonic() + 0.5
        try:
            committed = sum(max(tp.offset, 0) for tp in
                            self.consumer.committed(self.in_parts, timeout=2))
            now = (committed, self.last[1], sum(self._end(tp) for tp in self.out_parts))
        except Exception:  # KafkaException / timeouts during a broker restart
            return self.last
        if now != self.last and self.history_file is not None:
            history.append(self.history_file, "progress", committed=now[0], end=now[1],
                           output=now[2])
        self.last = now
        return self.last

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.consumer.close()


class App:
    """The command under test: one process group per start, its output in a log file per
    start. Every path out of the harness (done, error, Ctrl-C) kills the whole group."""

    def __init__(self, command: list[str], env: dict[str, str], run_dir: Path):
        self.command, self.env, self.run_dir = command, env, run_dir
        self.history = run_dir / "history.jsonl"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = self.run_dir / f"app-{self.starts}.log"
        with open(log, "wb") as out:
            try:
                # A session of its own: SIGKILL reaches every process the command started
                # (a shell's java, a script's workers), not only the first one.
                self.proc = proc.spawn(self.command, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=self.env, group=True)
            except OSError as exc:
                raise HarnessError(f"cannot start {self.command[0]!r}: {exc}") from None
        history.append(self.history, "started", attempt=self.starts, pid=self.proc.pid)

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        """SIGKILL the whole process group: nothing is flushed, closed or committed."""
        proc.kill([self.proc], group=True)
        history.append(self.history, "killed", attempt=self.starts)

    def stop(self) -> None:
        """SIGTERM the group (a chance to close cleanly), SIGKILL whatever is left."""
        if self.proc is None:
            return
        # The group's other members get the SIGKILL in any case (a shell's java, workers).
        proc.stop([self.proc], STOP_GRACE_S, group=True)
        history.append(self.history, "stopped", attempt=self.starts, code=self.proc.returncode)
        self.proc = None

    def tail(self) -> str:
        log = self.run_dir / f"app-{self.starts}.log"
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:] if log.exists() else []
        return "\n".join(f"  | {line}" for line in lines) or "  | (no output)"

    def __enter__(self) -> "App":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
