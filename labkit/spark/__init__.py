"""Spark Structured Streaming with the official Kafka connector.

``session()`` builds the lab's local SparkSession with spark-sql-kafka-0-10 on the classpath.
"""
from labkit.spark.session import session

__all__ = ["session"]
