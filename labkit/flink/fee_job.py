"""The learner's Flink job: payments in, the card fee added, payments out, exactly once.

Plain PyFlink, nothing of the lab's: it runs in PyFlink's own environment, in a process the
lab starts (``labkit.flink.jobmain``), SIGKILLs and starts again from the latest retained
checkpoint, as a supervisor would. The lab calls ``fee_job`` with the names, directories and
settings of one run; a learner's job is a function like it (a cell's text), called the same
way with the parameters it names.

Flink's Kafka sink is a two-phase commit. With EXACTLY_ONCE every checkpoint has a Kafka
transaction of its own (transactional id ``<prefix>-<subtask>-<checkpoint id>``): the records
go into it as they come, the checkpoint barrier pre-commits it (flushed, still open), and
only when the whole checkpoint has completed does the sink commit it. A reader with
read_committed sees the output one checkpoint at a time.
"""
from __future__ import annotations

import json

from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.common.serialization import SimpleStringSchema
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.datastream.connectors.base import DeliveryGuarantee
from pyflink.datastream.connectors.kafka import (KafkaOffsetsInitializer,
                                                 KafkaRecordSerializationSchema, KafkaSink,
                                                 KafkaSource)


def add_fee(value: str) -> str:
    """The business logic (labkit.pipelines.ctp.transform): a card fee of 2.9 % + 30 cents.
    The payment keeps its id, which the audit counts by."""
    payment = json.loads(value)
    payment["fee_cents"] = round(payment["amount_cents"] * 0.029) + 30
    return json.dumps(payment)


def fee_job(bootstrap: str, input_topic: str, output_topic: str, group_id: str,
            transactional_id_prefix: str, delivery_guarantee: str, checkpoint_dir: str,
            checkpoint_interval_ms: int, transaction_timeout_ms: int,
            restore_from: str | None, connector_jars: list[str],
            kafka_properties: dict[str, str]) -> None:
    config = Configuration()
    config.set_string("execution.checkpointing.interval", f"{checkpoint_interval_ms} ms")
    config.set_string("execution.checkpointing.dir", checkpoint_dir)
    # Keep the last completed checkpoint when the job ends: what a restart restores from.
    config.set_string("execution.checkpointing.externalized-checkpoint-retention",
                      "RETAIN_ON_CANCELLATION")
    # A failure ends the job (and its process): the supervisor outside restarts it.
    config.set_string("restart-strategy.type", "none")
    # The Python function runs inside the JVM (PEMJA), not in a Python worker of its own.
    config.set_string("python.execution-mode", "thread")
    if restore_from:  # the checkpoint a restart resumes from: source offsets, open transactions
        config.set_string("execution.state-recovery.path", restore_from)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.add_jars(*connector_jars)
    env.set_parallelism(1)

    source = (KafkaSource.builder()
              .set_bootstrap_servers(bootstrap)
              .set_topics(input_topic)
              .set_group_id(group_id)
              .set_starting_offsets(KafkaOffsetsInitializer.earliest())
              .set_value_only_deserializer(SimpleStringSchema())
              .set_property("isolation.level", "read_committed"))
    sink = (KafkaSink.builder()
            .set_bootstrap_servers(bootstrap)
            .set_record_serializer(KafkaRecordSerializationSchema.builder()
                                   .set_topic(output_topic)
                                   .set_value_serialization_schema(SimpleStringSchema())
                                   .build())
            .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE
                                    if delivery_guarantee == "exactly_once"
                                    else DeliveryGuarantee.AT_LEAST_ONCE)
            .set_transactional_id_prefix(transactional_id_prefix)
            .set_property("transaction.timeout.ms", str(transaction_timeout_ms)))
    for key, value in kafka_properties.items():  # a secured cluster's settings, if any
        source.set_property(key, value)
        sink.set_property(key, value)

    (env.from_source(source.build(), WatermarkStrategy.no_watermarks(), "payments")
        .map(add_fee, output_type=Types.STRING())
        .sink_to(sink.build()))
    env.execute("fees")
