"""A small, quiet local SparkSession with the Kafka connector on the classpath, or a Spark
Connect session to a shared server when LABKIT_SPARK_REMOTE is set (labkit.spark.connect)."""
from __future__ import annotations

import os
import subprocess
import sys

from labkit import settings

from labkit.kafka import jvm, startup_archive
from labkit.paths import spark_remote
from labkit.progress import status

# local[2, 4]: 2 threads, and a failed task is tried up to 4 times, as spark.task.maxFailures
# (default 4) does on a cluster. Plain local[2] fails the job at a task's first failure, so
# the task-retry lesson (a task dies once, its retry writes the partition again) needs this.
# (the default of LABKIT_SPARK_MASTER, in labkit.settings)

# Settings a Connect client sets on the server for its own session (runtime SQL settings);
# the static ones below (jars, memory, UI, bind address) are the server's (labkit.spark.connect).
REMOTE_CONF = {"spark.sql.shuffle.partitions": "2",
               "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"}


def driver_classpath_key() -> str:
    """What the local driver's classpath depends on (spark-submit builds it from pyspark's
    jars): a startup archive is kept per value of this."""
    import pyspark

    return f"{os.path.dirname(pyspark.__file__)}:{pyspark.__version__}"


def make_startup_archive() -> None:
    """Start a local driver that writes Spark's startup archive when it exits (in a process
    of its own: the archive is written when the JVM exits). Once, from `labkit setup`."""
    code = ("from labkit.kafka import startup_archive\n"
            "from labkit.spark.session import session\n"
            "with startup_archive.making('spark'):\n"
            "    spark = session('labkit-setup', local=True)\n"
            "spark.range(100).selectExpr('id % 7 AS k').groupBy('k').count().collect()\n"
            "spark.stop()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"the Spark driver failed:\n{out.stderr[-1500:]}")


def session(app_name: str = "labkit", java_options: str = "", *, local: bool = False, **conf: str):
    """Return the lab's SparkSession (created once per Python process).

    Two threads match a 2-core laptop; the UI is off and logs are quiet so notebook output
    shows the experiment, not Spark's chatter. Extra settings go in ``conf``; extra JVM
    flags in ``java_options`` (added to the quiet-logging default, not replacing it).

    With LABKIT_SPARK_REMOTE=sc://host:port this is a Spark Connect session on that server
    (no local JVM; ``java_options`` do not apply), unless ``local=True``: a driver this
    process owns, for the crash experiments that kill it.
    """
    remote = None if local else spark_remote()
    if remote:
        return remote_session(remote, app_name, **conf)
    # A Connect session sets SPARK_CONNECT_MODE_ENABLED in its process, and pyspark then
    # builds every session as a Connect one; a worker started from that process (a kernel
    # that recounted on the server) inherits it, but its driver must be local.
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    from pyspark.sql import SparkSession

    java = jvm.check_java()
    # LABKIT_SPARK_JARS (comma-separated) replaces the pinned connector jars: only for
    # measuring another Spark version (benchmarks/spark.py), whose connector must match it.
    jars = settings.current().spark_jars or ",".join(str(p) for p in jvm.resolve("spark"))
    # Python workers must use this interpreter (the venv's), not whatever python3 is on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("JAVA_HOME", os.path.dirname(os.path.dirname(os.path.realpath(java))))
    builder = (
        SparkSession.builder.master(settings.current().spark_master)
        .appName(app_name)
        .config("spark.jars", jars)
        .config("spark.driver.memory", settings.current().spark_memory)
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
        # collect() serves its rows on a local socket that waits this long for Python to
        # connect (15 s by default): a fresh clone's suite on 2 cores once took longer, and a
        # foreachBatch's collect() failed with "Connection refused" (08c)
        .config("spark.python.authenticate.socketTimeout", "120s")
        .config("spark.driver.extraJavaOptions",
                " ".join(["-Dlog4j2.level=WARN", *startup_archive.options(
                    "spark", java, driver_classpath_key()), java_options]).strip())
    )
    for key, value in conf.items():
        builder = builder.config(key.replace("_", "."), value)
    with status(f"Starting Spark ({settings.current().spark_master}) with the Kafka connector"):
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
    return spark



def remote_session(url: str, app_name: str = "labkit", **conf: str):
    """A Spark Connect session on the server at ``url``: a session of its own there, so its
    settings do not touch other learners' sessions on the same server."""
    from pyspark.sql import SparkSession

    with status(f"Connecting to the Spark Connect server {url}"):
        spark = SparkSession.builder.remote(url).appName(app_name).getOrCreate()
        for key, value in {**REMOTE_CONF, **{k.replace("_", "."): v for k, v in conf.items()}}.items():
            spark.conf.set(key, value)
    return spark


def stop_remote() -> None:
    """End this process's Spark Connect session, if it has one, while its server is up: a
    client whose server has gone retries for minutes when the interpreter exits."""
    if "pyspark.sql.connect.session" not in sys.modules:
        return  # never connected
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    remote = RemoteSession._get_default_session()
    if remote is not None:
        remote.stop()
