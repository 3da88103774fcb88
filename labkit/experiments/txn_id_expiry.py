"""Does fencing outlive an idle transactional.id? (transactional.id.expiration.ms)

    run = txn_id_expiry(expiration_ms=2000)   # -> TxnIdExpiryRun
    run.zombie_errors          # ['INVALID_PRODUCER_ID_MAPPING (abortable)', '_FENCED (fatal)']
    run.report.duplicated      # 0: the zombie wrote nothing, though its id had expired

The coordinator forgets a transactional.id that has been idle longer than
transactional.id.expiration.ms (Kafka: 7 days), and with it the producer id and epoch
that fence an old instance. The run, on a broker of its own (the setting and the interval
at which expired ids are removed are the broker's):

1. instance A commits the first half of the payments, then stays idle past the expiration;
2. instance B, its replacement, starts with the same transactional.id and commits the
   second half;
3. A, the zombie, wakes up and commits the second half too, handling each error as 05b's
   loop does: abortable, abort and try again; fatal, stop.

The audit reads the output as read_committed: anything the zombie got through would be a
duplicate.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaException, Producer

from labkit.checking import audit

from labkit.kafka import names, topics

from labkit.pipelines import data
from labkit.checking.audit import AuditReport
from labkit.kafka.localcluster import private_cluster
from labkit.pipelines.fee_loop import classified
from labkit.kafka.inspect import describe_topic
from labkit.experiments.poll_zombie import fee_service
from labkit.experiments.producer_expiry import check_expiration
from labkit.experiments.registry import OWN_BROKER, Experiment, Option, RunBasics, register
from labkit.progress import status

SCENARIO = "txn-id-expiry"
KAFKA_DEFAULT_MS = 604_800_000  # transactional.id.expiration.ms: 7 days
EXPIRATION_MS = 2000
CLEANUP_INTERVAL_MS = 500  # transaction.remove.expired.transaction.cleanup.interval.ms (Kafka: 1 h)
ATTEMPTS = 3  # the zombie's tries: an abortable error lets it try again


@dataclass
class TxnIdExpiryRun(RunBasics):
    report: AuditReport
    expiration_ms: int
    idle_s: float  # how long A stayed idle before B started
    zombie_errors: list[str] = field(default_factory=list)  # each error A's commit met, classified
    zombie_committed: bool = False  # did A's commit go through?
    # producer ids of the data batches in the output: 2 when B got a new one (A's id had
    # expired), 1 when B took A's over with a bumped epoch
    producer_ids: int = 0

    def to_json(self) -> str:
        return json.dumps({**json.loads(self.report.to_json()), "expiration_ms": self.expiration_ms,
                           "idle_s": self.idle_s, "zombie_errors": self.zombie_errors,
                           "zombie_committed": self.zombie_committed,
                           "producer_ids": self.producer_ids})

    def summary(self) -> str:
        told = " then ".join(self.zombie_errors) or "nothing"
        return (f"transactional.id.expiration.ms={self.expiration_ms}, A idle {self.idle_s:.0f} s: "
                f"producer ids in the output: {self.producer_ids}; zombie told {told}; "
                f"its commit went through: {self.zombie_committed}\n"
                f"{self.report.summary()}")


def check_settings(expiration_ms: int, records: int) -> None:
    """A ValueError that says what to use, before any broker starts."""
    check_expiration(expiration_ms, KAFKA_DEFAULT_MS)
    if records < 2 or records % 2:
        raise ValueError(f"records must be even and 2 or more (A commits the first half, "
                         f"B and the zombie the second), not {records}")


def _commit(producer: Producer, topic: str, payments: list[dict]) -> None:
    producer.begin_transaction()
    for payment in payments:
        producer.produce(topic, key=payment["key"], value=topics.encode(payment))
    producer.commit_transaction(30)


def zombie_commits(producer: Producer, topic: str, payments: list[dict],
                   errors: list[str]) -> bool:
    """The zombie's commit, each error handled by its class; True if it went through."""
    for _ in range(ATTEMPTS):
        try:
            _commit(producer, topic, payments)
            return True
        except KafkaException as exc:
            err = exc.args[0]
            errors.append(classified(err))
            if not err.txn_requires_abort():
                return False  # fatal: this producer is done
        try:
            producer.abort_transaction(30)  # abortable: abort, then try again
        except KafkaException as exc:  # the abort asks for a new epoch, which may be refused
            errors.append(classified(exc.args[0]))
            return False
    return False


def txn_id_expiry(expiration_ms: int = EXPIRATION_MS, records: int = 10,
                  announce: Callable[[str], None] = print) -> TxnIdExpiryRun:
    """A idle past ``expiration_ms``, B takes over, A wakes up: audited read_committed."""
    check_settings(expiration_ms, records)
    announce("This experiment changes a broker setting, so it starts a Kafka of its own on "
             "this machine (one broker), whatever cluster your other lessons use.")
    properties = {"transactional.id.expiration.ms": expiration_ms,
                  "transaction.remove.expired.transaction.cleanup.interval.ms": CLEANUP_INTERVAL_MS}
    idle_s = 2 * (expiration_ms + CLEANUP_INTERVAL_MS) / 1000 if expiration_ms < 60_000 else 5.0
    with private_cluster("txn-id-expiry-", properties=properties) as lab, \
            status("A commits, idles; B takes over; A wakes up") as say:
        topic = names.topic("txn-id-expiry")
        topics.create(lab.bootstrap, topic)
        app_id = names.transactional_id("fee-service")
        payments = data.generate(records, prefix="t")
        first, second = payments[:records // 2], payments[records // 2:]
        a = fee_service(lab.bootstrap, app_id)  # instance A
        _commit(a, topic, first)
        say(f"instance A idle for {idle_s:.0f} s")
        time.sleep(idle_s)
        b = fee_service(lab.bootstrap, app_id)  # instance B, A's replacement
        _commit(b, topic, second)
        say("instance A wakes up")
        errors: list[str] = []
        committed = zombie_commits(a, topic, second, errors)
        report = audit.audit_topic(lab.bootstrap, topic, payments, SCENARIO, "exactly_once",
                                   fault=f"A idle {idle_s:.0f} s, then a zombie")
        batches = describe_topic(lab.bootstrap, topic).batches
        producer_ids = len({b.producer_id for b in batches if not b.is_control})
    return TxnIdExpiryRun(report, expiration_ms, idle_s, errors, committed, producer_ids)


register(Experiment(
    "txn-id-expiry", "A idles past transactional.id.expiration.ms, B takes its id, A wakes up",
    lambda context, expiration_ms, records: txn_id_expiry(expiration_ms, records,
                                                          announce=context.announce),
    where=OWN_BROKER, check=check_settings, options=(
        Option("expiration_ms", EXPIRATION_MS, "the broker's transactional.id.expiration.ms "
               f"(Kafka's: {KAFKA_DEFAULT_MS})", kind=int),
        Option("records", 10, "how many records (even: A commits the first half)", kind=int,
               short="-n"))))
