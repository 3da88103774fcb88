"""A Java loop under the judge (``labkit.pipelines.java_loop``): the same run as a Python
loop's, the same phases, faults and findings; only how an instance starts differs.

A Python loop is sent to each worker process as the text of its cell; a Java loop is
compiled once per run (javac into the run's directory) and each instance is that class's
JVM, a command the pool starts, kills and restarts as any app's (``labkit.faults.pool``).
Its settings are its environment, under the names a Python loop's keyword arguments have
(``Lab.setting("input_topic")``), so a member that joins and a successor that takes an
instance's transactional id get them as a Python one does. What it raised reaches the run's
history through ``Lab.java`` (``raised``, with KIP-1050's class of it), crash points through
the same ``LABKIT_CRASH_*`` variables.
"""
from __future__ import annotations

from typing import Any

from labkit import settings
from labkit.kafka import connection, javaconfig
from labkit.pipelines.java_loop import JavaLoop, as_java


def loop_of(run: Any) -> JavaLoop | None:
    """The run's loop if it is a Java one (a JavaLoop or a .java file's path)."""
    return as_java(run.pipeline)


def command(run: Any, loop: JavaLoop) -> list[str]:
    """Compiled now, once for the run; the command each of its instances runs."""
    run.step(f"judge: javac {loop.name}.java", "the compiler")
    return loop.command(loop.compile(run.workdir / "java"))


def shared_env(run: Any) -> dict[str, str | None]:
    """What every instance's environment holds beside its own settings: where the cluster is
    (the fault proxy's address, when the judge has one in between) and, for a cluster that
    wants TLS or credentials, its Java client settings in a file (None: left out)."""
    bootstrap = run.client_bootstrap
    config = (javaconfig.write(run.workdir / "client-java.properties", bootstrap)
              if connection.for_client(bootstrap) else None)
    return {"bootstrap": bootstrap, settings.KAFKA_JAVA_CONFIG: str(config) if config else None}
