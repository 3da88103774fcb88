"""Spark with the official Kafka connector reads and writes the real broker."""
from __future__ import annotations

import pytest
from confluent_kafka import Producer

from tests.kafka_helpers import consume_all

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    from labkit.spark import session
    s = session("test-session")
    yield s
    s.stop()
    # pyspark keeps its JVM until Python exits, and in it Spark's pooled Kafka producer, which
    # logs retries once the shared broker stops: end the JVM now (it exits when its stdin closes).
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    gateway.shutdown()
    gateway.proc.stdin.close()
    gateway.proc.wait(30)
    SparkContext._gateway = SparkContext._jvm = None


def test_workers_use_the_driver_interpreter(spark):
    import sys
    got = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable).collect()
    assert got == [sys.executable]


def test_batch_read_returns_the_produced_rows(spark, bootstrap, topic_name):
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        producer.produce(topic_name, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert producer.flush(10) == 0
    rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic_name).load()
            .selectExpr("CAST(key AS STRING) k", "CAST(value AS STRING) v", "offset").collect())
    assert sorted((r.k, r.v) for r in rows) == sorted((f"k{i}", f"v{i}") for i in range(10))
    assert sorted(r.offset for r in rows) == list(range(10))


def test_kafka_sink_rows_are_read_back_by_a_consumer(spark, bootstrap, topic_name):
    df = spark.createDataFrame([(f"k{i}", f"out-{i}") for i in range(5)], ["key", "value"])
    (df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic_name).save())
    assert sorted(consume_all(bootstrap, topic_name, 5)) == sorted(f"out-{i}".encode() for i in range(5))
