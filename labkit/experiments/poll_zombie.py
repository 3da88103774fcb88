"""A zombie made by slowness: a member whose batch outlasts ``max.poll.interval.ms``.

    run = poll_interval_zombie(lab.bootstrap, fencing="group")   # or "none"
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
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from labkit.checking import audit

from labkit.kafka import names, topics

from labkit.pipelines import data
from labkit.checking.audit import AuditReport
from labkit.kafka.clientlog import client_config
from labkit.pipelines.fee_loop import BATCH, classified, copy_fees
from labkit.pipelines.ctp import transform
from labkit.pipelines.group import bare_group_metadata
from labkit.experiments.registry import Experiment, Option, RunBasics, register
from labkit.progress import status

SCENARIO = "poll-interval-zombie"
FENCING = ("group", "none")
# librdkafka wants max.poll.interval.ms >= session.timeout.ms, and the broker a session of
# at least group.min.session.timeout.ms (6 s by default): the shortest the lab can use.
MAX_POLL_INTERVAL_MS = 6000
DONE_WAIT_S = 120  # how long A's slow batch waits for B to finish the input
FIRST_BATCH_WAIT_S = 60  # how long A waits for its first batch (group join, fetch)


@dataclass
class PollZombieRun(RunBasics):
    report: AuditReport
    fencing: str
    zombie_error: str | None  # what A's send_offsets_to_transaction/commit raised, classified
    slow_s: float  # how long A's batch took between its poll and its offsets
    poll_after: str | None  # the error A's next polls reported, if any (often _MAX_POLL_EXCEEDED)

    def to_json(self) -> str:
        return json.dumps({**json.loads(self.report.to_json()), "fencing": self.fencing,
                           "zombie_error": self.zombie_error, "poll_after": self.poll_after,
                           "slow_s": round(self.slow_s, 1)})


def check_settings(fencing: str, records: int) -> None:
    """A ValueError that says what to use, before anything is written."""
    if fencing not in FENCING:
        raise ValueError(f"fencing must be one of {', '.join(FENCING)}, not {fencing!r}")
    if records < 2 * BATCH:
        raise ValueError(f"records must be {2 * BATCH} or more (A's batch of {BATCH} and more)")


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
                                       "transactional.id": transactional_id}))
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


def poll_interval_zombie(bootstrap: str, fencing: str = "group", records: int = 20,
                         loop: Callable[..., None] = copy_fees) -> PollZombieRun:
    """Instance A reads one batch and writes its fees in a transaction, then is slow until
    instance B has taken over and copied the whole input with ``loop`` (called as
    ``copy_fees`` is: notebook 06's on screen); then A sends its offsets (``fencing``: with
    its group metadata, or the group id only) and commits."""
    check_settings(fencing, records)
    base = names.topic(f"poll-zombie-{fencing}-{time.monotonic_ns() % 10**9}")
    source, output = f"{base}-in", f"{base}-out"
    inputs = data.generate(records, prefix="z")
    data.load_into_topic(bootstrap, source, inputs)
    topics.create(bootstrap, output)
    errors: list[str] = []
    b_done = threading.Event()

    def instance_b() -> None:
        consumer = member(bootstrap, base, "instance-B", eof=True)
        producer = fee_service(bootstrap, f"{base}-b")
        consumer.subscribe([source])
        try:
            loop(consumer, producer, output, records, lambda n: None, lambda n, ok: None, errors)
        finally:
            consumer.close()
            b_done.set()

    with status(f"A batch slower than max.poll.interval.ms ({fencing})") as say:
        consumer, producer = member(bootstrap, base, "instance-A"), fee_service(bootstrap, f"{base}-a")
        consumer.subscribe([source])
        batch: list = []
        deadline = time.monotonic() + FIRST_BATCH_WAIT_S
        while not batch:  # A's first batch, read in the group's first generation
            if time.monotonic() > deadline:
                raise TimeoutError(f"instance A read no record in {FIRST_BATCH_WAIT_S} s")
            batch = [m for m in consumer.consume(BATCH, timeout=1.0) if m.error() is None]
        polled = time.monotonic()
        producer.begin_transaction()
        for msg in batch:
            producer.produce(output, key=msg.key(),
                             value=topics.encode(transform(topics.decode(msg.value()))))
        producer.flush(30)
        say("instance A is slow over its batch; instance B joins the group")
        b = threading.Thread(target=instance_b, name="instance-B", daemon=True)
        b.start()
        if not b_done.wait(DONE_WAIT_S):
            raise TimeoutError(f"instance B did not finish the input in {DONE_WAIT_S} s")
        slow_s = time.monotonic() - polled
        say("instance B is done; instance A sends its offsets and commits")
        offsets = [TopicPartition(source, batch[-1].partition(), batch[-1].offset() + 1)]
        metadata = (consumer.consumer_group_metadata() if fencing == "group"
                    else bare_group_metadata(bootstrap, base))
        zombie_error = None
        try:
            producer.send_offsets_to_transaction(offsets, metadata, 60)
            producer.commit_transaction(60)
        except KafkaException as exc:
            err = exc.args[0]
            zombie_error = classified(err)
            if not err.txn_requires_abort():
                raise
            producer.abort_transaction(60)
        poll_after = next_poll_error(consumer)
        consumer.close()
    report = audit.audit_topic(bootstrap, output, inputs, SCENARIO, "exactly_once",
                               fault=f"a batch slower than max.poll.interval.ms ({fencing})")
    topics.delete(bootstrap, source, output)
    return PollZombieRun(report, fencing, zombie_error, slow_s, poll_after)


def _text(run: PollZombieRun) -> str:
    told = run.zombie_error or "nothing: its commit went through"
    return f"{run.report.summary()}\nzombie told: {told}; its next poll: {run.poll_after}"


register(Experiment(
    SCENARIO, "a member slower than max.poll.interval.ms over one batch commits late",
    lambda context, fencing, records: poll_interval_zombie(context.bootstrap, fencing, records,
                                                           context.pipeline or copy_fees),
    check=check_settings, text=_text, pipeline="the loop instance B runs (as copy_fees)",
    stall_s=DONE_WAIT_S + 60,  # its slow batch waits up to DONE_WAIT_S without a step
    options=(Option("fencing", "group", "A's offsets carry its group metadata (KIP-447) or "
                    "the group id only", FENCING),
             Option("records", 20, "how many input records", kind=int, short="-n"))))
