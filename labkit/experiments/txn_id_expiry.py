"""Does fencing outlive an idle transactional.id? (transactional.id.expiration.ms)

    run = experiments.run("txn-id-expiry", expiration_ms=2000)
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
duplicate. The parts: the broker of its own, one topic, the client (A, B and the zombie in
one thread, reporting ``committed`` once A has), the nemesis (A left idle on that event:
``Pause``) and the audit of the topic (``TopicAudit``).
"""
from __future__ import annotations

from confluent_kafka import KafkaException, Producer

from labkit.checking.checks import TopicAudit
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.acknowledged import halves
from labkit.pipelines.fee_loop import classified
from labkit.experiments.parts import Topic, Workload, in_thread
from labkit.experiments.poll_zombie import fee_service
from labkit.experiments.registry import OWN_BROKER, Experiment, Option, register
from labkit.faults.nemesis import Nemesis, on
from labkit.faults.process_faults import Pause
from labkit.kafka import topics
from labkit.kafka.inspect import describe_topic
from labkit.pipelines import data

SCENARIO = "txn-id-expiry"
KAFKA_DEFAULT_MS = 604_800_000  # transactional.id.expiration.ms: 7 days
EXPIRATION_MS = 2000
CLEANUP_INTERVAL_MS = 500  # transaction.remove.expired.transaction.cleanup.interval.ms (Kafka: 1 h)
ATTEMPTS = 3  # the zombie's tries: an abortable error lets it try again


def idle_s(expiration_ms: int) -> float:
    """How long A stays idle: twice the expiration and a cleanup (5 s past a minute)."""
    return 2 * (expiration_ms + CLEANUP_INTERVAL_MS) / 1000 if expiration_ms < 60_000 else 5.0


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


def a_b_and_the_zombie(run) -> None:
    """A commits the first half and is left idle; B, its replacement with the same
    transactional.id, commits the second; A wakes up and commits it too."""
    topic, app_id = run.topics["output"], run.transactional_id()
    first, second = halves(run.inputs)
    with run.status("A commits, idles; B takes over; A wakes up"):
        a = fee_service(run.client_bootstrap, app_id)  # instance A
        _commit(a, topic, first)
        run.event("committed", instance="A")  # A is left idle
        b = fee_service(run.client_bootstrap, app_id)  # instance B, A's replacement
        _commit(b, topic, second)
        run.step("instance A wakes up")
        errors: list[str] = []
        run.observe(zombie_committed=zombie_commits(a, topic, second, errors),
                    zombie_errors=errors)


def _facts(run) -> dict:
    batches = describe_topic(run.bootstrap, run.topics["output"]).batches
    return {"expiration_ms": run.o.expiration_ms, "idle_s": idle_s(run.o.expiration_ms),
            # 2 when B got a new producer id (A's had expired), 1 when B took A's over
            "producer_ids": len({b.producer_id for b in batches if not b.is_control})}


def _summary(run) -> str:
    told = " then ".join(run.zombie_errors) or "nothing"
    return (f"transactional.id.expiration.ms={run.expiration_ms}, A idle {run.idle_s:.0f} s: "
            f"producer ids in the output: {run.producer_ids}; zombie told {told}; "
            f"its commit went through: {run.zombie_committed}\n"
            f"{run.report.summary()}")


def _even(records: int, **_) -> None:
    if records % 2:
        raise ValueError(f"records must be even (A commits the first half, B and the zombie "
                         f"the second), not {records}")


register(Experiment(
    SCENARIO, "A idles past transactional.id.expiration.ms, B takes its id, A wakes up",
    where=OWN_BROKER, check=_even, options=(
        Option("expiration_ms", EXPIRATION_MS, "the broker's transactional.id.expiration.ms "
               f"(Kafka's: {KAFKA_DEFAULT_MS})", kind=int, minimum=1,
               why=f"Kafka's default is {KAFKA_DEFAULT_MS}"),
        common.records(10, "records (even: A commits the first half)", minimum=2,
                why="A commits the first half, B and the zombie the second")),
    broker=lambda o: {"transactional.id.expiration.ms": o.expiration_ms,
                      "transaction.remove.expired.transaction.cleanup.interval.ms":
                          CLEANUP_INTERVAL_MS},
    workload=lambda o: Workload("txn-id-expiry", (Topic("output"),),
                                data.generate(o.records, prefix="t")),
    clients=in_thread(a_b_and_the_zombie),
    nemesis=lambda o: Nemesis(Pause(on("committed", instance="A"), idle_s(o.expiration_ms),
                                    who="instance A")),
    checkers=lambda o: [TopicAudit(SCENARIO, "exactly_once",
                                   fault=f"A idle {idle_s(o.expiration_ms):.0f} s, then a zombie")],
    facts=_facts,
    presentation=Presentation(summary=_summary, json_facts=(
        "expiration_ms", "idle_s", "zombie_errors", "zombie_committed", "producer_ids"))))
