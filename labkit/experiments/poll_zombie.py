"""A zombie made by slowness: a member whose batch outlasts ``max.poll.interval.ms``.

    run = experiments.run("poll-interval-zombie", fencing="group")   # or "none"
    run.zombie_error         # 'UNKNOWN_MEMBER_ID (abortable)' with group metadata, None without
    run.report.duplicated    # 0 with group metadata, 10 without

Nobody freezes instance A (no SIGSTOP): its process runs, its client's background thread
keeps heartbeating, it only takes too long over one batch between two polls. When B joins,
the group rebalances; A does not poll, so it does not rejoin within ``max.poll.interval.ms``
and the group goes on without it (librdkafka also leaves the group for A once that interval
has passed without a poll). The group gives the partition to instance B, which runs the fee loop of notebook
05b (``labkit.pipelines.fee_loop.copy_fees``) over the whole input, A's batch included. Then A
finishes its batch and sends its offsets to its transaction:

- ``fencing="group"``: with ``consumer_group_metadata()`` (KIP-447): the group coordinator
  no longer knows A's member id and refuses them (abortable); A aborts. Each record once.
- ``fencing="none"``: with the group id only (the pre-KIP-447 form): nothing to check, A's
  commit goes through, its batch is in the output twice.

The parts: the input and output topics; the clients, A and B in threads of the run
(``pipeline=``: the loop B runs, 06's on screen); the nemesis holds A up over its batch
until B is done (``Pause`` on A's ``batch-in-transaction``, ``DONE_WAIT_S`` at most); the
audit of the output, read as read_committed.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from labkit.checking.checks import TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import Experiment, Option, register
from labkit.faults.nemesis import Nemesis, on
from labkit.faults.process_faults import Pause
from labkit.kafka import topics
from labkit.kafka.clientlog import COORDINATOR_STALL_WORKAROUND_MS, client_config
from labkit.pipelines import data
from labkit.pipelines.fee_loop import BATCH, classified, copy_fees
from labkit.pipelines.ctp import transform
from labkit.pipelines.group import bare_group_metadata

SCENARIO = "poll-interval-zombie"
FENCING = ("group", "none")
# librdkafka wants max.poll.interval.ms >= session.timeout.ms, and the broker a session of
# at least group.min.session.timeout.ms (6 s by default): the shortest the lab can use.
MAX_POLL_INTERVAL_MS = 6000
DONE_WAIT_S = 120  # how long A's slow batch waits for B to finish the input
FIRST_BATCH_WAIT_S = 60  # how long A waits for its first batch (group join, fetch)


def member(bootstrap: str, group: str, name: str, eof: bool = False) -> Consumer:
    """``eof``: report each partition's end (B's loop may stop there; A's next polls must
    show its own error, not an end of partition)."""
    return Consumer(client_config({
        "bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "isolation.level": "read_committed", "session.timeout.ms": MAX_POLL_INTERVAL_MS,
        "max.poll.interval.ms": MAX_POLL_INTERVAL_MS, "enable.partition.eof": eof}))


def fee_service(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer(client_config({"bootstrap.servers": bootstrap,
                                       "transactional.id": transactional_id,
                                       "connections.max.idle.ms": COORDINATOR_STALL_WORKAROUND_MS}))
    producer.init_transactions(60)
    return producer


def next_poll_error(consumer: Consumer, timeout_s: float = 10.0) -> str | None:
    """The error A's next polls report (librdkafka's _MAX_POLL_EXCEEDED), past any records
    it had fetched ahead before it left the group (they come first; A does not process
    them, the run is over for it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is not None:
            return msg.error().name()
    return None


def _first_batch(consumer: Consumer) -> list:
    """A's first batch, read in the group's first generation."""
    deadline = time.monotonic() + FIRST_BATCH_WAIT_S
    batch: list = []
    while not batch:
        if time.monotonic() > deadline:
            raise TimeoutError(f"instance A read no record in {FIRST_BATCH_WAIT_S} s")
        batch = [m for m in consumer.consume(BATCH, timeout=1.0) if m.error() is None]
    return batch


class SlowMember:
    """The clients: instance A reads one batch and writes its fees in a transaction, reports
    ``batch-in-transaction`` (the nemesis holds it up there until instance B is done), then
    sends its offsets (``fencing``: with its group metadata, or the group id only) and
    commits. Instance B joins the group once A has its batch and copies the whole input with
    ``loop`` (called as ``copy_fees`` is: notebook 06's on screen), in a thread of its own."""

    def __init__(self, loop: Callable[..., None]):
        self.loop = loop
        self.b_done = threading.Event()
        self.b_failed: list[BaseException] = []

    def instance_b(self, run) -> None:
        consumer = member(run.client_bootstrap, run.group_id, "instance-B", eof=True)
        try:
            producer = fee_service(run.client_bootstrap, run.transactional_id(1))
            consumer.subscribe([run.topics["input"]])
            self.loop(consumer, producer, run.topics["output"], len(run.inputs),
                      lambda n: None, lambda n, ok: None, [])
        except BaseException as exc:  # raised in the run's thread, once A is done waiting
            self.b_failed.append(exc)
        finally:
            consumer.close()
            self.b_done.set()

    def __call__(self, run) -> None:
        fencing, source, output = run.o.fencing, run.topics["input"], run.topics["output"]
        bootstrap = run.client_bootstrap
        with run.status(f"A batch slower than max.poll.interval.ms ({fencing})"):
            consumer = member(bootstrap, run.group_id, "instance-A")
            try:
                producer = fee_service(bootstrap, run.transactional_id(0))
                consumer.subscribe([source])
                batch = _first_batch(consumer)
                polled = time.monotonic()
                producer.begin_transaction()
                for msg in batch:
                    producer.produce(output, key=msg.key(),
                                     value=topics.encode(transform(topics.decode(msg.value()))))
                producer.flush(30)
                run.step("instance A is slow over its batch; instance B joins the group")
                b = threading.Thread(target=self.instance_b, args=(run,), name="instance-B",
                                     daemon=True)
                b.start()
                run.event("batch-in-transaction", instance="A")  # held up here (the nemesis)
                if not self.b_done.is_set():
                    raise TimeoutError(f"instance B did not finish the input in {DONE_WAIT_S} s")
                if self.b_failed:
                    raise self.b_failed[0]
                slow_s = time.monotonic() - polled
                run.step("instance B is done; instance A sends its offsets and commits")
                offsets = [TopicPartition(source, batch[-1].partition(), batch[-1].offset() + 1)]
                metadata = (consumer.consumer_group_metadata() if fencing == "group"
                            else bare_group_metadata(bootstrap, run.group_id))
                run.observe(fencing=fencing, zombie_error=_late_commit(producer, offsets, metadata),
                            slow_s=slow_s, poll_after=next_poll_error(consumer))
            finally:
                consumer.close()


def _late_commit(producer: Producer, offsets: list, metadata) -> str | None:
    """A's offsets and commit, late: what they raised, classified (None: it went through)."""
    try:
        producer.send_offsets_to_transaction(offsets, metadata, 60)
        producer.commit_transaction(60)
    except KafkaException as exc:
        err = exc.args[0]
        if not err.txn_requires_abort():
            raise
        producer.abort_transaction(60)
        return classified(err)
    return None


def _text(run) -> str:
    told = run.zombie_error or "nothing: its commit went through"
    return f"{run.report.summary()}\nzombie told: {told}; its next poll: {run.poll_after}"


def _json(run) -> dict:
    return {**run.report.to_dict(), "fencing": run.fencing, "zombie_error": run.zombie_error,
            "poll_after": run.poll_after, "slow_s": round(run.slow_s, 1)}


register(Experiment(
    SCENARIO, "a member slower than max.poll.interval.ms over one batch commits late",
    text=_text, pipeline="the loop instance B runs (as copy_fees)",
    options=(Option("fencing", "group", "A's offsets carry its group metadata (KIP-447) or "
                    "the group id only", FENCING),
             common.records(20, minimum=2 * BATCH, why=f"A's batch of {BATCH} and more")),
    workload=lambda o: Workload(f"poll-zombie-{o.fencing}",
                                (Topic("input", loaded=True), Topic("output")),
                                data.generate(o.records, prefix="z")),
    clients=lambda run: SlowMember(run.pipeline or copy_fees),
    nemesis=lambda o: Nemesis(Pause(on("batch-in-transaction", instance="A"), DONE_WAIT_S,
                                    who="instance A", what="instance B has copied the input",
                                    until=lambda run: run.clients.b_done.is_set())),
    checkers=lambda o: [TopicAudit(SCENARIO, "exactly_once",
                                   fault=f"a batch slower than max.poll.interval.ms ({o.fencing})")],
    presentation=Presentation(json=_json)))
