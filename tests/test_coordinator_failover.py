"""The transaction coordinator dies under an exactly-once consume-transform-produce loop,
once mid-transaction and once between EndTxn and the COMMIT markers (the partitions'
leader frozen so no marker can be written first): each input record is in the output once,
read_committed, in every run. Two runs in CI: one here through the CLI on a lab of its own,
and notebook 05b's (whose audit nbval compares).
"""
from __future__ import annotations

import threading
import time

import psutil
import pytest
from confluent_kafka import Consumer, KafkaException, Producer

from labkit import experiments
from labkit.experiments import failover
from labkit.experiments.context import RunContext

from labkit.kafka import coordinators, names, topics

from labkit.pipelines import data
from labkit.kafka import clientlog
from labkit.kafka.clientlog import client_config
from labkit.exercises.coordinator import check_next_coordinator, judge
from labkit.faults.broker_faults import FreezeBroker
from labkit.faults.nemesis import after
from labkit.faults.watchdog import ExperimentStalled
from labkit.pipelines import fee_loop
from labkit.pipelines.fee_loop import errors_by_class
from labkit.progress import wait_until
from tests.test_failover import scenario_on_a_lab_of_its_own

RECORDS = 60


def test_a_freeze_the_commit_outlasts_is_lifted_by_its_timer(failure_lab):
    """The deadlock breaker: a commit that needs the frozen broker (its coordinator's ISR
    too small without it) gets it back after the freeze's limit (coordinator-failover's
    FREEZE_LIMIT_S), and the run says so."""
    window = FreezeBroker(2, after(0), thaw_after_s=3)
    process = psutil.Process(failure_lab.broker(2).pid)
    # taken before the freeze: its timer starts inside invoke() (a CI run measured 2.999 s
    # from invoke()'s return to the thaw)
    frozen_at = time.monotonic()
    window.invoke(RunContext("freeze-timer", {}, cluster=failure_lab))
    wait_until(lambda: process.status() == psutil.STATUS_STOPPED, "the freeze", 2)
    wait_until(lambda: process.status() != psutil.STATUS_STOPPED, "the timer's thaw", 10)
    assert time.monotonic() - frozen_at >= 3
    assert window.stop_timer() is True
    window.thaw()  # the timer thawed it already: nothing left to do, no error


def test_an_exactly_once_loop_survives_its_coordinator_dying_twice(tmp_path):
    """Through the CLI, on a lab of its own (it leaves no JVM); notebook 05b runs the same
    experiment in process and nbval compares its audit."""
    run = scenario_on_a_lab_of_its_own(tmp_path, 400, "coordinator-failover",
                                       "--records", str(RECORDS))
    timeline = "\n".join(run["timeline"])
    assert (run["scenario"], run["produced"], run["lost"], run["duplicated"],
            run["aborted_visible"], run["delivered_unique"]) == (
        "coordinator-failover", RECORDS, 0, 0, 0, RECORDS), timeline
    # the coordinator moved at each kill, and the second kill came after EndTxn returned
    # while no marker could have been written yet
    first, second, third = run["coordinators"]
    assert first != second != third, run["coordinators"]
    assert "frozen: no marker can be written" in timeline, timeline
    assert "SIGKILLed before it could write the markers" in timeline, timeline


def test_the_next_coordinator_is_the_first_in_sync_replica_in_replica_order(failure_lab):
    """The rule notebook 05b's exercise asks for, measured: kill an id's coordinator, ask
    the brokers where the id went. A wrong guess gets a hint, not the answer."""
    tid = "fee-service-rule"
    Producer(client_config({"bootstrap.servers": failure_lab.bootstrap, "transactional.id": tid,
                            "log_level": 2})).init_transactions(60)
    _, state = coordinators.transaction_state_partition(failure_lab, tid)
    predicted = next(r for r in state.replicas if r != state.leader and r in state.isr)
    before, after = coordinators.kill_coordinator(failure_lab, tid)
    assert (before, after) == (state.leader, predicted), state
    wrong = next(b for b in failover.BROKERS if b not in (before, after))
    hint = judge(wrong, before, after)
    assert not hint.passed and f"broker {after}" not in hint.message
    assert "fill in" in check_next_coordinator(failure_lab, tid, None).message
    assert "must be a broker id" in check_next_coordinator(failure_lab, tid, 7).message


def test_the_error_table_names_each_class_and_refuses_an_unclassified_error():
    """Notebook 06's table: one row per error as classified() wrote it; anything else is
    refused with what it expects."""
    table = errors_by_class([("a", "_FENCED (fatal)"), ("b", "UNKNOWN_MEMBER_ID (abortable)")])
    assert list(table["class"]) == ["fatal", "abortable"]
    assert table["what the app does"][0].startswith("close this producer")
    with pytest.raises(ValueError, match="as classified\\(\\) writes it"):
        errors_by_class([("c", "UNKNOWN_MEMBER_ID")])


def test_send_offsets_returns_after_its_group_coordinator_left_the_cluster(failure_lab):
    """The cause of the coordinator-failover hangs, on real brokers: the consumer group's
    coordinator is frozen past broker.session.timeout.ms, so the controller fences it and it
    leaves the metadata the producer reads (librdkafka drops its handle), then it comes back.
    librdkafka 2.16.1 alone then waits in send_offsets_to_transaction() past its own timeout
    (over 180 s measured, issues 5511 and 5456); with connections.max.idle.ms set
    (clientlog.COORDINATOR_STALL_WORKAROUND_MS) it returns within seconds."""
    failure_lab.restart()
    group_broker, leader = 2, 1
    base = names.topic(f"stall-{time.monotonic_ns() % 10**9}")
    source, output = f"{base}-in", f"{base}-out"
    topics.create(failure_lab.bootstrap, source, output, replica_assignment=[[leader, 2, 3]])
    data.load_into_topic(failure_lab.bootstrap, source, data.generate(30, prefix="s"))
    group = coordinators.group_coordinated_by(failure_lab, group_broker, base)
    # only the group's coordinator is frozen: the transaction's is on another broker
    transactional_id = coordinators.transactional_id_away_from(failure_lab, group_broker, base)
    producer = Producer(client_config({"bootstrap.servers": failure_lab.bootstrap,
                                       "transactional.id": transactional_id, "log_level": 2,
                                       "connections.max.idle.ms":
                                           clientlog.COORDINATOR_STALL_WORKAROUND_MS}))
    consumer = Consumer(client_config({
        "bootstrap.servers": failure_lab.bootstrap, "group.id": group, "log_level": 2,
        "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
    consumer.subscribe([source])
    producer.init_transactions(30)

    def one_transaction() -> float:
        """A batch copied in one transaction; how long send_offsets_to_transaction took."""
        batch: list = []
        deadline = time.monotonic() + 30
        while not batch and time.monotonic() < deadline:
            batch = [m for m in consumer.consume(10, timeout=1.0) if m.error() is None]
        assert batch, "no input within 30 s"
        producer.begin_transaction()
        for msg in batch:
            producer.produce(output, msg.value())
        took: list[float] = []
        started = time.monotonic()

        def send() -> None:
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 10)
            took.append(time.monotonic() - started)
        caller = threading.Thread(target=send, daemon=True)  # a hang must not hang the suite
        caller.start()
        caller.join(60)
        assert took, "send_offsets_to_transaction(timeout=10) still blocked after 60 s"
        producer.commit_transaction(30)
        return took[0]

    def in_metadata() -> bool | None:
        """Whether the producer's metadata lists the group's broker (None: no answer)."""
        try:
            return group_broker in producer.list_topics(timeout=2).brokers
        except KafkaException:  # asked the frozen broker
            return None

    try:
        assert one_transaction() < 10
        with failure_lab.frozen(group_broker):
            wait_until(lambda: in_metadata() is False,
                                "the frozen group coordinator fenced, gone from metadata", 30)
        wait_until(lambda: in_metadata() is True,
                            "the thawed broker back in the metadata", 60)
        took = one_transaction()
        coordinator = coordinators.transaction_coordinator(failure_lab, transactional_id)
        assert took < 30, (took, f"group coordinator {group_broker}, "
                                 f"transaction coordinator {coordinator}")
    finally:
        consumer.close()
        topics.delete(failure_lab.bootstrap, source, output)


def test_a_stalled_experiment_stops_with_its_last_step_and_leaves_no_broker(failure_lab):
    """The watchdog: a loop that stops making progress after its first batch (a blocked
    call, here a wait) ends the run after stall_s with an error naming the last step and
    what it waited for, and the lab's brokers are stopped, not left running."""
    release = threading.Event()

    def stalls_after_one_batch(consumer, producer, output, records, before_commit, after_end,
                               errors):
        def after(batch_no: int, committed: bool) -> None:
            after_end(batch_no, committed)
            release.wait(300)  # stuck, as a call blocked inside librdkafka would be
            raise RuntimeError("released by the test")
        fee_loop.copy_fees(consumer, producer, output, records, before_commit, after, errors)

    started = time.monotonic()
    try:
        with pytest.raises(ExperimentStalled) as stalled:
            experiments.run("coordinator-failover", cluster=failure_lab,
                            records=RECORDS,
                            pipeline=stalls_after_one_batch, stall_after=8)
        took = time.monotonic() - started
        message = str(stalled.value)
        assert "no progress for 8 s" in message, message
        assert "Last step" in message and "batch 1: committed" in message, message
        assert "batch 2: consume, produce, send_offsets_to_transaction()" in message, message
        assert took < 120, f"the watchdog took {took:.0f} s"
        assert set(failure_lab.process_states().values()) == {"down"}, \
            failure_lab.process_states()
        for broker in failure_lab.brokers:
            assert broker.pid is None or not psutil.pid_exists(broker.pid) or \
                psutil.Process(broker.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        release.set()
        failure_lab.restart()  # the next test's lab has its brokers
