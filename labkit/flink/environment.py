"""Where a Flink job runs: PyFlink in an environment of its own, the Kafka connector's jars.

PyFlink 2.2 pins packages the lab pins differently (pandas < 2.3, pyarrow < 21, its own
numpy and protobuf), so it gets a virtualenv of its own under .cache/apps/pyflink-venv,
created on first use from the exact list below (``labkit.appenv``). Its wheels are most of
the cost: apache-flink-libraries alone is 313 MB (Flink's jars, a local cluster in one
JVM); measured on first use, see docs/measurements.md. Flink's official Kafka connector is
not in PyFlink: ``jvm/pom.xml``'s ``flink`` profile fetches it, with its kafka-clients,
from Maven Central (``labkit setup``; about 23 MB).

    python = environment.python()            # the venv's python (created once)
    jars = environment.connector_jars()      # flink-connector-kafka, kafka-clients, ...
    env = environment.child_env(folder)      # what a job's process is started with
"""
from __future__ import annotations

import os
from pathlib import Path

from labkit import settings
from labkit.appenv import app_env, is_ready
from labkit.kafka import jvm

PYFLINK_VERSION = "2.2.1"  # the release flink-connector-kafka 5.0.0-2.2 is built for
ENV_NAME = "pyflink"
# `pip freeze` of `pip install apache-flink==2.2.1` on Python 3.11: every package pinned, so
# pip neither backtracks (it tried 4 pyarrows and 5 proto-plus without pins) nor drifts.
REQUIREMENTS = (
    "apache-flink==2.2.1", "apache-flink-libraries==2.2.1", "apache-beam==2.61.0",
    "attrs==26.1.0", "avro==1.12.2", "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3", "cloudpickle==2.2.1", "crcmod==1.7", "dill==0.3.1.1",
    "dnspython==2.9.2", "docopt==0.6.2", "fastavro==1.13.1", "fasteners==0.20",
    "find_libpython==0.5.1", "grpcio==1.65.5", "hdfs==2.7.3", "httplib2==0.22.0",
    "idna==3.20", "jsonpickle==3.4.2", "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1", "numpy==2.1.3", "objsize==0.7.1",
    "orjson==3.13.0", "packaging==26.4", "pandas==2.2.3", "pemja==0.5.7",
    "proto-plus==1.28.2", "protobuf==5.29.6", "py4j==0.10.9.7", "pyarrow==16.1.0",
    "pyarrow-hotfix==0.7", "pydot==1.4.2", "PyJWT==2.15.1", "pymongo==4.20.1",
    "pyparsing==3.3.3", "python-dateutil==2.9.0.post0", "pytz==2026.6", "PyYAML==6.0.4",
    "redis==5.3.1", "referencing==0.37.0", "regex==2026.11.19", "requests==2.34.2",
    "rpds-py==2026.9.1", "ruamel.yaml==0.19.1", "six==1.17.0", "sortedcontainers==2.4.0",
    "typing_extensions==4.16.0", "tzdata==2026.6", "urllib3==2.8.0", "zstandard==0.25.0",
)
# The job's JVM (the local cluster: job manager and task manager in one process) lives a
# minute and moves little data: the lab's short-lived JVM flags, and a heap that leaves a
# 2-core laptop room for the broker.
JOB_HEAP = "768m"


def python() -> Path:
    """PyFlink's python, its environment created on first use (about 470 MB of wheels)."""
    return app_env(ENV_NAME, REQUIREMENTS)


def ready() -> Path:
    """PyFlink's environment and the connector's jars, each made now if new (a progress line
    each, once: minutes on first use) rather than in a job's start, whose time a run counts.
    Returns the environment's python."""
    connector_jars()
    return python()


def is_installed() -> bool:
    return is_ready(ENV_NAME, REQUIREMENTS)


def connector_jars() -> list[Path]:
    """flink-connector-kafka and what it needs beside Flink (kafka-clients, compression
    codecs, Jackson), resolved from Maven Central once (``labkit setup`` does it too)."""
    return jvm.resolve("flink")


def child_env(folder: Path, python_path: Path | None = None) -> dict[str, str]:
    """The environment of a job's process: the venv first on PATH (PyFlink starts its
    Python functions with ``python``), the job's JVM sized, its log in ``folder/log`` and
    its temporary files in ``folder/tmp``: the local cluster copies 24 MB of jars there at
    each start, and a SIGKILLed JVM never deletes them, so they go with the run's folder."""
    py = python_path or python()
    tmp = folder / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    java = jvm.check_java()
    env.update({
        "PATH": f"{py.parent}{os.pathsep}{env.get('PATH', '')}",
        "VIRTUAL_ENV": str(py.parent.parent),
        "JAVA_HOME": str(Path(java).resolve().parent.parent),
        "JVM_ARGS": f"-Xmx{JOB_HEAP} {settings.SHORT_LIVED_JVM} -Djava.io.tmpdir={tmp}",
        "TMPDIR": str(tmp),
        "FLINK_LOG_DIR": str(folder / "log"),
        "PYTHONUNBUFFERED": "1",
    })
    return env
