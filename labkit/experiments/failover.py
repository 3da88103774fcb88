"""When a broker fails: what acks, min.insync.replicas and unclean election keep.

    run = experiments.run("leader-failover", acks="1")              # a failure lab of its own
    run = experiments.run("leader-failover", cluster=lab, acks="1",  # one you hold, with 03b's
                          pipeline=write_payments, settings=producer_settings)  # loop, settings
        run.lost_acknowledged                        # acknowledged to the producer, then gone

The composition, every step done to a real broker process:

- workload: a topic with one partition on brokers 1, 2 and 3 (broker 1 leads), with the
  run's ``min.insync.replicas`` and ``unclean.leader.election.enable``;
- client: a produce loop whose delivery reports are kept (``AcknowledgingProducer``: the
  notebook's loop and settings, or the reference ones). It is handed the first half of the
  records; when it asks for more, the client waits until every replica has them and
  reports ``copied``; it is handed the second half and, while it waits for its answers,
  is heard out for ``ACK_WAIT_S`` before ``sent`` is reported; then the client waits for
  the controller's election (``elected``, or ``offline`` when no replica may lead) while
  the loop's retries reach the new leader;
- nemesis: both followers frozen (SIGSTOP) on ``copied``, so they stop copying (with
  ``out_of_sync`` the client waits until the leader has dropped them from the ISR; else they
  are still in it); the leader SIGKILLed and the followers thawed on ``sent``; the old
  leader restarted on ``elected`` (in the background: as a follower it cuts its log back to
  the new leader's) or on ``offline`` (it leads again);
- checker: the partition read from the start; an id the loop's delivery callback noted as
  acknowledged (its report had no error) and that is not there is ``lost_acknowledged``
  (``labkit.checking.checks.AcknowledgedWrites``).

Followers frozen past ``broker.session.timeout.ms`` are fenced, and then no election is
clean: on a starved machine that can happen before the kill, and such a run is made again
(``missed``). While it runs, ``ReplicaWatch`` hands each change of the partition's leader,
ISR and broker processes to the run's ``watch`` (a ``widgets.ReplicaBoard``), or prints it.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from labkit import progress
from labkit.checking.checks import AcknowledgedWrites
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.acknowledged import AcknowledgingProducer, check_loop, halves
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import FAILURE_LAB, REQUIRED, Experiment, Option, register
from labkit.faults.broker_faults import (FreezeBroker, KillBroker, RestartBroker, ThawBroker,
                                         WholeLab)
from labkit.faults.nemesis import Nemesis, on
from labkit.kafka.brokerconfig import FAILURE_LAB_PROPERTIES
from labkit.kafka.inspect import (InspectError, Inspector, ReplicaMoment, ReplicaState,
                                  UnknownTopicError)
from labkit.kafka.localcluster import LocalCluster
from labkit.pipelines import data
from labkit.pipelines.delivery_reports import write_payments
from labkit.progress import wait_until

SCENARIO = "leader-failover"
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
ATTEMPTS = 3  # runs whose fault missed its window, at most (see _missed)
DELIVERY_TIMEOUT_MS = 20_000  # a record not acknowledged by then is reported failed
# The JSON `labkit scenario leader-failover --json` prints, in this order.
RUN_KEYS = ("acks", "min_insync", "unclean", "out_of_sync", "produced", "acknowledged",
            "not_acknowledged", "in_log", "lost_acknowledged", "duplicated", "election",
            "new_leader")


def out_of_sync(o) -> bool:
    """Are the followers kept frozen until they leave the ISR? (an unclean election needs
    a replica out of sync to elect)"""
    return o.out_of_sync or o.unclean


def fail_the_leader(run, client: AcknowledgingProducer) -> None:
    """The client's order of things; the faults fire on the events it reports."""
    lab, topic = run.cluster, run.topics["output"]
    first, second = halves(run.inputs)
    # without a live view (the CLI), each change of the partition is a line of the timeline
    show = run.watch or (lambda moment: progress.step(moment.text()))
    with run.status("Leader failover"), ReplicaWatch(lab, topic, show, run.elapsed) as watcher:

        def step(what: str, state: ReplicaState) -> ReplicaState:
            run.step(what, detail=state.text())
            watcher.mark(what, state)
            return state

        def payments():
            yield from first
            # The loop asks for the next one: the producer sends the first half by itself.
            wait_until_replicated(lab, topic, len(first))
            step(f"{len(first)} records written, copied to all 3",
                 replica_state(lab, topic, LEADER))
            frozen_at = time.monotonic()
            run.event("copied")  # the followers are frozen
            if out_of_sync(run.o):
                wait_until(lambda: replica_state(lab, topic, LEADER).isr == (LEADER,),
                           "the leader to drop the frozen followers from the ISR",
                           FAILURE_LAB_PROPERTIES["replica.lag.time.max.ms"] / 1000 * 4)
                step("followers frozen, out of the ISR", replica_state(lab, topic, LEADER))
            else:
                # The step (a metadata request, a redrawn board) runs inside the settle time,
                # not after it: frozen followers send the controller no heartbeat, and once
                # broker.session.timeout.ms (4 s) has passed they are fenced and leave the
                # ISR. A CI run under load got there before the kill (03b: "election: none").
                step("followers frozen (still in the ISR)", replica_state(lab, topic, LEADER))
                time.sleep(max(0.0, SETTLE_S - (time.monotonic() - frozen_at)))
            yield from second
            # the loop now waits for its answers (flush): the leader dies meanwhile
            client.meanwhile(lambda: kill_the_leader(frozen_at))

        def kill_the_leader(frozen_at: float) -> None:
            client.answered(within_s=ACK_WAIT_S)
            before = step(f"{len(second)} more sent: {len(client.acknowledged)} acknowledged "
                          "so far", replica_state(lab, topic, LEADER))
            run.event("sent")  # the leader is killed, the followers thawed
            run.observe(frozen_s=round(time.monotonic() - frozen_at, 1))
            new = _wait_for_new_leader(lab, topic, unclean=run.o.unclean)
            if new.leader is None:
                step("leader killed: no replica may lead", new)
                run.event("offline")  # the old leader is started again
                # asked of a follower: broker 1 answers metadata before it has taken the lead
                wait_until(lambda: _leader_seen_by(lab, topic, FOLLOWERS[0]) == LEADER,
                           "the restarted broker 1 to lead again", 30)
                new = step("old leader restarted: it leads again",
                           replica_state(lab, topic, FOLLOWERS[0]))
            else:
                # the elected broker, thawed, may replay the election after the follower that
                # reported it: asked too soon, it still names the dead leader (a fresh clone's
                # 03b printed "election: none" for an unclean election that lost 20)
                wait_until(lambda: _leader_seen_by(lab, topic, new.leader) == new.leader,
                           f"the elected broker {new.leader} to know it leads", 30)
                new = step("leader killed, followers thawed: elected",
                           replica_state(lab, topic, new.leader))
                run.event("elected")  # the old leader rejoins as a follower while we audit
            run.observe(new_leader=new.leader, election=_election(before, new),
                        out_of_sync=out_of_sync(run.o))

        # the loop's retries reach the new leader within its message.timeout.ms
        client.write(payments())


def _missed(run) -> str | None:
    # In-sync followers that are alive always give a clean election; "none" means the
    # controller fenced them while they were frozen: the fault missed its window (a
    # starved machine stretched it past broker.session.timeout.ms), not Kafka's answer.
    if out_of_sync(run.o) or not run.facts["election"].startswith("none"):
        return None
    return f"the followers were frozen {run.facts['frozen_s']:.1f} s, long enough to be fenced"


def _summary(run) -> str:
    o = run.options
    refused = ", ".join(f"{n} {e}" for e, n in sorted(run.not_acknowledged.items())) or "none"
    return (f"acks={o['acks']} min.insync.replicas={o['min_insync']} "
            f"unclean={str(o['unclean']).lower()}: produced={run.produced} "
            f"acknowledged={run.acknowledged} in_log={run.in_log} "
            f"lost_acknowledged={run.lost_acknowledged} duplicated={run.duplicated}\n"
            f"    not acknowledged: {refused}; election: {run.election}")


class ReplicaWatch:
    """A live view, no fault: asks a running broker for the partition's leader and ISR
    every ``interval_s`` and hands each change (or a change of a broker's process) to
    ``show``, on a thread of its own; on exit, after the thread has stopped, the last moment
    is shown once more. A frozen broker is never asked: it would take the connection and
    never answer."""

    def __init__(self, lab: LocalCluster, topic: str,
                 show: Callable[[ReplicaMoment], None] | None, clock: Callable[[], float],
                 interval_s: float = 0.3):
        self.lab, self.topic, self.show, self.clock = lab, topic, show, clock  # clock: seconds in
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
        return ReplicaMoment(self.clock(), self.step, state,
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


def replica_state(lab: LocalCluster, topic: str, at: int, timeout_s: float = 5) -> ReplicaState:
    """The partition as broker ``at`` sees it (a frozen broker is never asked)."""
    address = lab.broker(at).address
    with Inspector(address, timeout_s=timeout_s) as inspector:
        return inspector.replica_states(topic, at=address)[0]


def wait_until_replicated(lab: LocalCluster, topic: str, records: int) -> None:
    """Until the high watermark reaches ``records``: every in-sync replica has them. A
    broker an earlier run restarted may not know the run's new topic yet (its metadata
    still catching up: UNKNOWN_TOPIC_OR_PARTITION, seen in a fresh clone's suite), or not
    lead it yet (NOT_LEADER_OR_FOLLOWER, seen in another): not yet, not an error."""
    with Inspector(lab.broker(LEADER).address, timeout_s=5) as inspector:
        def high_watermark() -> int:
            try:
                return inspector.offsets(topic)[0].high_watermark
            except UnknownTopicError:
                return -1
            except InspectError as exc:
                if exc.leader_moved:
                    return -1
                raise
        wait_until(lambda: high_watermark() >= records,
                   "the followers to copy the first records", 30)


def _leader_seen_by(lab: LocalCluster, topic: str, broker: int) -> int | None:
    try:
        return replica_state(lab, topic, broker).leader
    except OSError:  # that broker is still starting
        return None


def _wait_for_new_leader(lab: LocalCluster, topic: str, unclean: bool) -> ReplicaState:
    """The partition once the controller has acted on the leader's death, as a follower
    sees it: led by another replica, or by none (``leader`` None: offline).

    With unclean election on, "none" is not the outcome yet. The thawed followers were
    fenced while frozen; the controller elects one of them, out of sync, as soon as it is
    unfenced (its first heartbeats after the thaw; ReplicationControlManager's
    handleBrokerUnfenced). A CI run that took the first "none" for the outcome restarted
    the old leader, which then lost that race and cut its log back to the follower's."""
    found: list[ReplicaState] = []

    def decided() -> bool:
        for b in FOLLOWERS:
            with contextlib.suppress(OSError):  # a thawed broker may still be catching up
                state = replica_state(lab, topic, b)
                if state.leader != LEADER and not (unclean and state.leader is None):
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


def producer_settings(bootstrap: str, acks: str) -> dict:
    """The producer under test, as notebook 03b shows it: its settings for ``acks``."""
    return {"bootstrap.servers": bootstrap, "acks": acks,
            "enable.idempotence": acks == "all",  # idempotence requires acks=all
            "linger.ms": 5, "message.timeout.ms": DELIVERY_TIMEOUT_MS}


register(Experiment(
    SCENARIO, "the partition's leader SIGKILLed after acknowledging records its followers "
    "never copied: what acks and min.insync.replicas keep",
    pipeline="the produce loop (as write_payments(producer, topic, payments, acknowledged, "
             "failed))", check_pipeline=check_loop,
    where=FAILURE_LAB, options=(
        Option("acks", REQUIRED, "the producer's acks", ACKS),
        Option("min_insync", 1, "the topic's min.insync.replicas", ("1", "2", "3"), kind=int,
               why="the topic has 3 replicas"),
        Option("unclean", False, "unclean.leader.election.enable=true (the followers are "
               "left out of the ISR first)", kind=bool),
        Option("out_of_sync", False, "freeze the followers until they leave the ISR "
               "(implied by --unclean)", kind=bool),
        common.records(100, "records (half before the fault)", minimum=2,
                why="half before the fault, half during"),
        Option("settings", None, "the producer's settings (as producer_settings(bootstrap, "
               "acks))", kind=object, cli=False),
    ),
    workload=lambda o: Workload("failover", (Topic("output", replica_assignment=[list(BROKERS)],
                                                   config={
        "min.insync.replicas": str(o.min_insync),
        "unclean.leader.election.enable": str(o.unclean).lower()}),),
        data.generate(o.records, prefix="f")),
    clients=lambda run: AcknowledgingProducer(fail_the_leader, acks=run.o.acks,
                                              settings=run.o.settings or producer_settings,
                                              loop=run.pipeline or write_payments),
    nemesis=lambda o: Nemesis(
        WholeLab(),  # the previous run's old leader may still be starting
        *(FreezeBroker(b, on("copied"), name=f"follower {b} frozen") for b in FOLLOWERS),
        KillBroker(LEADER, on("sent"), name="the leader SIGKILLed"), ThawBroker(on("sent")),
        RestartBroker(on("offline")), RestartBroker(on("elected"), wait=False)),
    checkers=lambda o: [AcknowledgedWrites(
        SCENARIO, f"acks={o.acks}", fault="leader SIGKILLed",
        # asked of the new leader: the old one may still be starting
        read_from=lambda run: run.cluster.broker(run.facts["new_leader"]).address)],
    missed=_missed, attempts=ATTEMPTS,
    presentation=Presentation(summary=_summary, json=lambda run: {
        "scenario": SCENARIO, **{k: run.facts[k] if k in run.facts else run.options[k]
                                 for k in RUN_KEYS}}),
    text=lambda run: f"{run.summary()}\n{run.timeline()}"))
