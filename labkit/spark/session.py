"""A small, quiet local SparkSession with the Kafka connector on the classpath."""
from __future__ import annotations

import os
import sys

from labkit import jvm
from labkit.progress import status

DRIVER_MEMORY = os.environ.get("LABKIT_SPARK_MEMORY", "1g")


def session(app_name: str = "labkit", java_options: str = "", **conf: str):
    """Return the lab's SparkSession (created once per Python process).

    local[2] matches a 2-core laptop; the UI is off and logs are quiet so notebook output
    shows the experiment, not Spark's chatter. Extra settings go in ``conf``; extra JVM
    flags in ``java_options`` (added to the quiet-logging default, not replacing it).
    """
    from pyspark.sql import SparkSession

    java = jvm.check_java()
    jars = ",".join(str(p) for p in jvm.resolve("spark"))
    # Python workers must use this interpreter (the venv's), not whatever python3 is on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("JAVA_HOME", os.path.dirname(os.path.dirname(os.path.realpath(java))))
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.jars", jars)
        .config("spark.driver.memory", DRIVER_MEMORY)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        # Delta Lake (its jars are in the spark jar set): the SQL extension and catalog Delta
        # documents, for DESCRIBE HISTORY on a path table (labkit.spark.delta).
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        # Small tables: a snapshot's state in 2 partitions, not Delta's default 50 tasks.
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.level=WARN {java_options}".strip())
    )
    for key, value in conf.items():
        builder = builder.config(key.replace("_", "."), value)
    with status("Starting Spark (local[2]) with the Kafka connector"):
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
    return spark

