"""When a broker fails: what acks, min.insync.replicas and unclean election keep.

    run = experiments.run("leader-failover", acks="1")   # on a failure lab of its own
    run = leader_failover(lab, acks="1")          # on a failure lab you hold (-> FailoverRun)
        run.lost_acknowledged                        # acknowledged to the producer, then gone

The experiment, every step done to a real broker process:

1. A topic with one partition on brokers 1, 2 and 3 (broker 1 leads), with the run's
   ``min.insync.replicas`` and ``unclean.leader.election.enable``.
2. The first half of the records is written and copied to every replica.
3. Both followers are frozen (SIGSTOP): they stop copying. With ``out_of_sync`` they stay
   frozen until the leader has dropped them from the ISR; otherwise they are still in it.
4. The second half is written; the producer hears back (or not) for ``ACK_WAIT_S``.
5. The leader is SIGKILLed and the followers thawed; the controller elects a new leader
   (or none: then the old leader is started again and leads once more). Followers frozen
   past ``broker.session.timeout.ms`` are fenced, and then no election is clean: on a
   starved machine that can happen before the kill, and such a run is made again.
6. The producer gets time to finish (its retries go to the new leader); the old leader is
   started again (in the background) and, as a follower now, cuts its log back to the new
   leader's.
7. The audit reads the partition from the start: an id the producer was told was written
   (its delivery report had no error) and that is not there is ``lost_acknowledged``.

It runs on a failure lab (``labkit.kafka.failure_lab``), always local and private.
``pipeline=`` is the producer's settings (a function of ``bootstrap`` and ``acks`` that
returns them, as ``producer_settings``): notebook 03b shows them as a cell, and the run
makes its producer from that cell.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from labkit.kafka import names, topics

from labkit.pipelines import data
from labkit.pipelines.learner import producer_from
from labkit.kafka.brokerconfig import FAILURE_LAB_PROPERTIES
from labkit.kafka.localcluster import LocalCluster
from labkit.kafka.inspect import InspectError, Inspector, ReplicaMoment, ReplicaState
from labkit import progress
from labkit.checking.audit import AuditReport
from labkit.experiments.registry import FAILURE_LAB, REQUIRED, Experiment, Option, register
from labkit.progress import status, wait_until

ACKS = ("0", "1", "all")
LEADER, FOLLOWERS = 1, (2, 3)
BROKERS = (LEADER, *FOLLOWERS)
ACK_WAIT_S = 1.0  # how long the producer is heard out while the followers are frozen
# A follower's fetch waits at the leader for new data (replica.fetch.wait.max.ms, 500 ms):
# records written while it waits go out in its answer and sit in the frozen follower's
# socket, to be read when it thaws. After this long no fetch is pending any more.
SETTLE_S = 1.0
# Until the controller has noticed the death (broker.session.timeout.ms) and a follower
# knows the outcome: a new leader, or none. Seconds on a quiet machine; generous for a
# loaded one (a CI run saw more than 10 s).
ELECTION_WAIT_S = 60.0
ATTEMPTS = 3  # runs whose fault missed its window, at most (see leader_failover)
DELIVERY_TIMEOUT_MS = 20_000  # a record not acknowledged by then is reported failed
# The JSON `labkit scenario leader-failover --json` prints, in this order.
RUN_KEYS = ("scenario", "acks", "min_insync", "unclean", "out_of_sync", "produced",
            "acknowledged", "not_acknowledged", "in_log", "lost_acknowledged", "duplicated",
            "election", "new_leader")


def producer_settings(bootstrap: str, acks: str) -> dict:
    """The producer under test, as notebook 03b shows it: its settings for ``acks``."""
    return {"bootstrap.servers": bootstrap, "acks": acks,
            "enable.idempotence": acks == "all",  # idempotence requires acks=all
            "linger.ms": 5, "message.timeout.ms": DELIVERY_TIMEOUT_MS}


class AcknowledgedRun:
    """The audit and topics of a run that checks what a producer was told was written
    (its ``acknowledged``, ``lost_acknowledged``, ``duplicated`` and ``topic``), after its
    ``fault``."""

    scenario = fault = ""

    @property
    def report(self) -> AuditReport:
        """The one audit over what the producer was told was written: an acknowledged
        record missing from the log is lost, one there twice is duplicated."""
        return AuditReport(self.scenario, f"acks={self.acks}", fault=self.fault,
                           produced=self.acknowledged,
                           delivered_unique=self.acknowledged - self.lost_acknowledged,
                           lost=self.lost_acknowledged, duplicated=self.duplicated)

    @property
    def topics(self) -> dict[str, str]:
        return {"output": self.topic} if self.topic else {}


@dataclass
class FailoverRun(AcknowledgedRun):
    acks: str
    min_insync: int
    unclean: bool
    out_of_sync: bool
    produced: int = 0
    acknowledged: int = 0
    not_acknowledged: dict[str, int] = field(default_factory=dict)  # error name -> records
    in_log: int = 0
    lost_acknowledged: int = 0
    duplicated: int = 0
    election: str = ""  # clean | eligible (ELR) | unclean | none
    new_leader: int | None = None
    frozen_s: float = 0.0  # from freezing the followers to the kill (they thaw right after)
    attempts: int = 1  # a run whose frozen followers were fenced is run again
    topic: str = ""  # the partition's topic (deleted with the failure lab)
    history: list[dict] = field(default_factory=list, repr=False)  # no workers: no events
    # (seconds since the start, what happened, the partition's state then)
    steps: list[tuple[float, str, str]] = field(default_factory=list, repr=False)

    scenario, fault = "leader-failover", "leader SIGKILLed"

    def to_dict(self) -> dict:
        d = {"scenario": self.scenario, **asdict(self)}
        return {k: d[k] for k in RUN_KEYS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def summary(self) -> str:
        refused = ", ".join(f"{n} {e}" for e, n in sorted(self.not_acknowledged.items())) or "none"
        return (f"acks={self.acks} min.insync.replicas={self.min_insync} "
                f"unclean={str(self.unclean).lower()}: produced={self.produced} "
                f"acknowledged={self.acknowledged} in_log={self.in_log} "
                f"lost_acknowledged={self.lost_acknowledged} duplicated={self.duplicated}\n"
                f"    not acknowledged: {refused}; election: {self.election}")

    def timeline(self) -> str:
        return "\n".join(f"{t:5.1f} s  {what:<44} {state}" for t, what, state in self.steps)


def leader_failover(lab: LocalCluster, acks: str = "1", min_insync: int = 1,
                    unclean: bool = False, out_of_sync: bool | None = None,
                    records: int = 100,
                    watch: Callable[[ReplicaMoment], None] | None = None,
                    settings: Callable[..., dict] = producer_settings) -> FailoverRun:
    """Kill a partition's leader after it acknowledged records its followers never copied.

    ``out_of_sync`` (default: as ``unclean``) keeps the followers frozen until they have left
    the ISR: an unclean election needs a replica that is out of sync to elect.
    ``min_insync`` 1 is Kafka's default. ``watch`` (e.g. a ``widgets.ReplicaBoard``) is
    handed each change of the partition's leader, ISR and broker processes while it runs.
    ``settings``: the producer's (``producer_settings`` by default)."""
    check_settings(acks, min_insync, records)
    out_of_sync = unclean if out_of_sync is None else out_of_sync
    for attempt in range(1, ATTEMPTS + 1):
        run = _fail_the_leader(lab, acks, min_insync, unclean, out_of_sync, records, watch,
                               settings)
        run.attempts = attempt
        # In-sync followers that are alive always give a clean election; "none" means the
        # controller fenced them while they were frozen: the fault missed its window (a
        # starved machine stretched it past broker.session.timeout.ms), not Kafka's answer.
        if out_of_sync or not run.election.startswith("none"):
            break
        progress.step(f"the followers were frozen {run.frozen_s:.1f} s, long enough to be "
                      f"fenced: the experiment is run again ({attempt} of {ATTEMPTS})")
    return run


def _fail_the_leader(lab: LocalCluster, acks: str, min_insync: int, unclean: bool,
                     out_of_sync: bool, records: int,
                     watch: Callable[[ReplicaMoment], None] | None,
                     settings: Callable[..., dict]) -> FailoverRun:
    lab.restart()  # every broker up: the previous run's old leader may still be starting
    topic = names.topic(f"failover-{time.monotonic_ns() % 10**9}")
    run = FailoverRun(acks, min_insync, unclean, out_of_sync, topic=topic)
    topics.create(lab.bootstrap, topic, replica_assignment=[[LEADER, *FOLLOWERS]], config={
        "min.insync.replicas": str(min_insync),
        "unclean.leader.election.enable": str(unclean).lower()})
    inputs = data.generate(records, prefix="f")
    first, second = inputs[:records // 2], inputs[records // 2:]
    acked: set[str] = set()
    refused: Counter[str] = Counter()

    def delivered(err, msg) -> None:
        rid = topics.decode(msg.value())["id"]
        if err is None:
            acked.add(rid)
        else:
            refused[err.name()] += 1

    # Its only log lines here are refused connections to the leader this run kills; what
    # matters to the audit comes back in the delivery reports.
    producer = producer_from(settings, lab.bootstrap, acks, log_level=2)
    start = time.monotonic()

    with status("Leader failover") as say, ReplicaWatch(lab, topic, watch, start) as watcher:
        def record(what: str, state: ReplicaState) -> ReplicaState:
            run.steps.append((round(time.monotonic() - start, 1), what, state.text()))
            say(what)
            progress.step(what)
            watcher.mark(what, state)
            return state

        def step(what: str, at: int) -> ReplicaState:
            return record(what, replica_state(lab, topic, at))

        for rec in first:
            producer.produce(topic, topics.encode(rec), partition=0, on_delivery=delivered)
        producer.flush(30)
        wait_until_replicated(lab, topic, len(first))
        step(f"{len(first)} records written, copied to all 3", LEADER)
        frozen_at = time.monotonic()
        with lab.frozen(*FOLLOWERS):
            if out_of_sync:
                wait_until(lambda: replica_state(lab, topic, LEADER).isr == (LEADER,),
                      "the leader to drop the frozen followers from the ISR",
                      FAILURE_LAB_PROPERTIES["replica.lag.time.max.ms"] / 1000 * 4)
                step("followers frozen, out of the ISR", LEADER)
            else:
                # The step (a metadata request, a redrawn board) runs inside the settle time,
                # not after it: frozen followers send the controller no heartbeat, and once
                # broker.session.timeout.ms (4 s) has passed they are fenced and leave the
                # ISR. A CI run under load got there before the kill (03b: "election: none").
                step("followers frozen (still in the ISR)", LEADER)
                time.sleep(max(0.0, SETTLE_S - (time.monotonic() - frozen_at)))
            for rec in second:
                producer.produce(topic, topics.encode(rec), partition=0, on_delivery=delivered)
            producer.flush(ACK_WAIT_S)
            before = step(f"{len(second)} more sent: {len(acked)} acknowledged so far", LEADER)
            lab.kill(LEADER)
        run.frozen_s = round(time.monotonic() - frozen_at, 1)
        new = _wait_for_new_leader(lab, topic)
        if new.leader is None:
            record("leader killed: no replica may lead", new)
            lab.restart(LEADER)
            # asked of a follower: broker 1 answers metadata before it has taken the lead
            wait_until(lambda: _leader_seen_by(lab, topic, FOLLOWERS[0]) == LEADER,
                       "the restarted broker 1 to lead again", 30)
            new = step("old leader restarted: it leads again", FOLLOWERS[0])
        else:
            new = step("leader killed, followers thawed: elected", new.leader)
            lab.restart(LEADER, wait=False)  # it rejoins as a follower while we audit
        producer.flush(DELIVERY_TIMEOUT_MS / 1000 + 5)

    run.new_leader = new.leader
    run.election = _election(before, new)
    # asked of the new leader: the old one may still be starting
    in_log = [r.value["id"] for r in topics.read(lab.broker(new.leader).address, topic,
                                                 "read_uncommitted")]
    run.produced = len(inputs)
    run.acknowledged = len(acked)
    run.not_acknowledged = dict(refused)
    run.in_log = len(set(in_log))
    run.lost_acknowledged = len(acked - set(in_log))
    run.duplicated = len(in_log) - len(set(in_log))
    return run


class ReplicaWatch:
    """Asks a running broker for the partition's leader and ISR every ``interval_s`` and
    hands each change (or a change of a broker's process) to ``show``, on a thread of its
    own; on exit, after the thread has stopped, the last moment is shown once more. A
    frozen broker is never asked: it would take the connection and never answer."""

    def __init__(self, lab: LocalCluster, topic: str,
                 show: Callable[[ReplicaMoment], None] | None, start: float,
                 interval_s: float = 0.3):
        self.lab, self.topic, self.show, self.start = lab, topic, show, start
        self.interval_s = interval_s
        self.step = "topic created"
        self._leader: int | None = LEADER
        self._last: ReplicaMoment | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="replica-watch", daemon=True)

    def moment(self) -> ReplicaMoment:
        processes = self.lab.process_states()
        running = [b for b, what in processes.items() if what == "running"]
        state = None
        for b in sorted(running, key=lambda b: b != self._leader):  # the leader knows best
            # frozen or killed since, or still starting (no metadata for the topic yet)
            with contextlib.suppress(OSError, TimeoutError, InspectError, ValueError):
                state = replica_state(self.lab, self.topic, b, timeout_s=2)
                break
        if state is not None:
            self._leader = state.leader
        return self._now(state)

    def _now(self, state: ReplicaState | None) -> ReplicaMoment:
        # the processes read after the state: a broker killed or frozen while it was being
        # asked shows as such
        return ReplicaMoment(round(time.monotonic() - self.start, 1), self.step, state,
                             self.lab.process_states())

    def mark(self, step: str, state: ReplicaState) -> None:
        """A step of the experiment, with the state it read: shown even if it lasts less
        than one poll (the election, just before the old leader is restarted)."""
        self.step = step
        if self.show is not None:
            self._offer(self._now(state))

    def _offer(self, moment: ReplicaMoment) -> None:
        with self._lock:  # the poller's thread and the experiment's
            last = self._last
            if last is not None and moment.seconds < last.seconds:
                return  # a poll that a step overtook
            if last is None or (moment.state, moment.processes, moment.step) != \
                    (last.state, last.processes, last.step):
                self._last = moment
                self.show(moment)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._offer(self.moment())

    def __enter__(self) -> "ReplicaWatch":
        if self.show is not None:
            self._thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.show is None:
            return
        self._stop.set()
        self._thread.join()
        if exc_type is None:  # after a failure, its error is what the learner needs to see
            self._offer(self.moment())


def check_settings(acks: str, min_insync: int, records: int) -> None:
    """A ValueError that says what to use, before any broker is started."""
    if acks not in ACKS:
        raise ValueError(f"acks must be one of {', '.join(ACKS)}, not {acks!r}")
    if min_insync not in (1, 2, 3):
        raise ValueError(f"min_insync must be 1, 2 or 3 (the topic has 3 replicas), not {min_insync}")
    if records < 2:
        raise ValueError(f"records must be 2 or more (half before the fault, half during), not {records}")


def replica_state(lab: LocalCluster, topic: str, at: int, timeout_s: float = 5) -> ReplicaState:
    """The partition as broker ``at`` sees it (a frozen broker is never asked)."""
    address = lab.broker(at).address
    with Inspector(address, timeout_s=timeout_s) as inspector:
        return inspector.replica_states(topic, at=address)[0]


def wait_until_replicated(lab: LocalCluster, topic: str, records: int) -> None:
    """Until the high watermark reaches ``records``: every in-sync replica has them."""
    with Inspector(lab.broker(LEADER).address, timeout_s=5) as inspector:
        wait_until(lambda: inspector.offsets(topic)[0].high_watermark >= records,
              "the followers to copy the first records", 30)


def _leader_seen_by(lab: LocalCluster, topic: str, broker: int) -> int | None:
    try:
        return replica_state(lab, topic, broker).leader
    except OSError:  # that broker is still starting
        return None


def _wait_for_new_leader(lab: LocalCluster, topic: str) -> ReplicaState:
    """The partition once the controller has acted on the leader's death, as a follower
    sees it: led by another replica, or by none (``leader`` None: offline)."""
    found: list[ReplicaState] = []

    def decided() -> bool:
        for b in FOLLOWERS:
            with contextlib.suppress(OSError):  # a thawed broker may still be catching up
                state = replica_state(lab, topic, b)
                if state.leader != LEADER:
                    found.append(state)
                    return True
        return False

    wait_until(decided, "the controller to replace the killed leader", ELECTION_WAIT_S)
    return found[0]


def _election(before: ReplicaState, after: ReplicaState) -> str:
    """How the new leader was chosen, from the partition's state just before the kill."""
    if after.leader == LEADER:
        return "none: offline until the old leader came back"
    if after.leader in before.isr:
        return "clean (an in-sync replica)"
    if after.leader in before.elr:
        return "clean (an eligible leader replica, KIP-966)"
    return "unclean (an out-of-sync replica)"


def _run(context, *, acks: str, min_insync: int, unclean: bool, out_of_sync: bool,
         records: int) -> FailoverRun:
    # without a live view (the CLI), each change of the partition is a line of the timeline
    watch = context.watch or (lambda moment: progress.step(moment.text()))
    return leader_failover(context.cluster, acks, min_insync, unclean, out_of_sync or None,
                           records, watch=watch, settings=context.pipeline or producer_settings)


register(Experiment(
    "leader-failover", "the partition's leader SIGKILLed after acknowledging records its "
    "followers never copied: what acks and min.insync.replicas keep",
    _run, where=FAILURE_LAB, pipeline="the producer's settings (as producer_settings)",
    check=lambda acks, min_insync, records, **_: check_settings(
        acks, min_insync, records),
    text=lambda run: f"{run.summary()}\n{run.timeline()}", options=(
        Option("acks", REQUIRED, "the producer's acks", ACKS),
        Option("min_insync", 1, "the topic's min.insync.replicas", kind=int),
        Option("unclean", False, "unclean.leader.election.enable=true (the followers are "
               "left out of the ISR first)", kind=bool),
        Option("out_of_sync", False, "freeze the followers until they leave the ISR "
               "(implied by --unclean)", kind=bool),
        Option("records", 100, "how many records (half before the fault)", kind=int, short="-n"),
    )))
