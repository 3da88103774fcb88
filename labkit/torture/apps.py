"""Apps the lab did not write, as commands for ``labkit torture``: Kafka's own
TransactionalMessageCopier (Java), a Kafka Streams running count (Java, single-file), a
quixstreams app (Python, in an environment of its own), a PyFlink job (its own environment,
restored from its latest checkpoint at each start: ``labkit.flink.app``), and a learner's
consume-transform-produce function from a notebook cell. ``python -m labkit.torture.apps
copier`` / ``... streams GUARANTEE`` / ``... flink GUARANTEE [...]`` / ``... function FILE
NAME`` runs one from the LABKIT_* environment the harness sets."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from labkit import proc, settings
from labkit.appenv import app_env  # noqa: F401 - where tests and docs have found it

from labkit.faults.proxy import FaultProxy
from labkit.flink import app as flink_app
from labkit.flink import environment as flink_environment
from labkit.kafka import connection, jvm, topics
from labkit.kafka import names as namespace
from labkit.pipelines import data, learner
from labkit.pipelines.contract import (ENV_BOOTSTRAP, ENV_GROUP, ENV_INPUT, ENV_OUTPUT,
                                     ENV_TRANSACTIONAL_ID, HarnessError)


def copier_command(transaction_size: int = 10, transaction_timeout_ms: int = 3000) -> list[str]:
    """Kafka's own TransactionalMessageCopier (kafka-tools) as a torture command: a shell
    line that reads the LABKIT_* environment when it runs, so the same command works for
    every run. It copies key and value unchanged, so the input's ids survive.

    It assigns itself partition 0 of the input (the harness's default, one partition), commits
    the group's offsets inside each transaction and exits when it has copied everything.

    ``transaction_timeout_ms`` is short because a restarted copier asks for its committed
    offset *before* it calls initTransactions: while its killed predecessor's transaction
    (holding an offset commit) is open, that fetch waits, and only the broker's timeout
    aborts it (the copier's default, 60 s, would stall every restart for a minute)."""
    java = jvm.check_java()
    jvm.resolve("tools")
    # A classpath wildcard (expanded by java itself) keeps the command line short enough to
    # read in `ps` and in the JSON result.
    jars = str(jvm.jar_dir("tools") / "*")
    script = (f"exec {shlex.quote(java)} -Xmx256m -XX:TieredStopAtLevel=1 "
              "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn "
              f"-cp {shlex.quote(jars)} org.apache.kafka.tools.TransactionalMessageCopier "
              f'--broker-list "${ENV_BOOTSTRAP}" --input-topic "${ENV_INPUT}" --input-partition 0 '
              f'--output-topic "${ENV_OUTPUT}" --consumer-group "${ENV_GROUP}" '
              f'--transactional-id "${ENV_TRANSACTIONAL_ID}" '
              f"--transaction-size {transaction_size} "
              f"--transaction-timeout {transaction_timeout_ms}")
    return ["sh", "-c", script]


def copy_with_java(bootstrap: str, name: str, records: list[dict], transaction_size: int = 5,
                   timeout_s: float = 120) -> tuple[int, list[dict]]:
    """Kafka's Java TransactionalMessageCopier copies ``records`` from topic ``<name>-in``
    to ``<name>-out`` in transactions of ``transaction_size``, through a fault proxy that
    records every request and injects nothing. Returns the copier's exit code and the
    requests it sent (the proxy's trace), to set beside librdkafka's."""
    data.load_into_topic(bootstrap, f"{name}-in", records)
    topics.create(bootstrap, f"{name}-out")
    trace: list[dict] = []
    with FaultProxy(bootstrap, trace=trace.append) as proxy:
        env = {**os.environ, ENV_BOOTSTRAP: proxy.bootstrap,
               ENV_INPUT: namespace.topic(f"{name}-in"), ENV_OUTPUT: namespace.topic(f"{name}-out"),
               ENV_GROUP: namespace.group(name), ENV_TRANSACTIONAL_ID: namespace.transactional_id(name)}
        # run() kills the copier if it outlives the timeout (sh execs java: one process)
        done = subprocess.run(copier_command(transaction_size=transaction_size), env=env,
                              timeout=timeout_s, capture_output=True, text=True)
    return done.returncode, trace


STREAMS_GUARANTEES = ("at_least_once", "exactly_once_v2")
STREAMS_APP = jvm.STREAMS_APP  # its file name (notebook 07 shows its source)


def streams_command(guarantee: str = "exactly_once_v2", *, commit_interval_ms: int = 1500,
                    work_ms: float = 5.0) -> list[str]:
    """examples/torture/StreamsRunningCount.java, a running count per key in real Kafka
    Streams (kafka-streams, fetched by `labkit setup`), as a command for
    ``torture(..., check="counts")``: Java 17's single-file launcher compiles it in memory at
    each start, so there is no build step. The app reads the LABKIT_* environment itself.

    ``guarantee`` is its processing.guarantee; ``commit_interval_ms`` the same for both (a
    kill between two commits replays what was processed since the last one);
    ``work_ms`` the processing time per record, so a run lasts long enough for the kills to
    land while it works. The defaults are those of tests/test_harness_streams.py and
    notebook 07 (with ``kill_clock="commit"``, ``kill_after_s=(0.5, 1.0)``)."""
    if guarantee not in STREAMS_GUARANTEES:
        raise HarnessError(f"unknown processing.guarantee {guarantee!r}: use one of "
                           f"{', '.join(STREAMS_GUARANTEES)}")
    return jvm.streams_app("--guarantee", guarantee, "--commit-interval-ms",
                           str(commit_interval_ms), "--work-ms", str(work_ms))


# quixstreams 3.28 needs confluent-kafka < 2.13 while the lab pins 2.16.1: like any user's
# app, it gets an environment of its own (the lab's pins do not move for it).
QUIX_REQUIREMENTS = ("quixstreams==3.28.1", "confluent-kafka==2.12.2")
QUIX_GUARANTEES = ("at-least-once", "exactly-once")


def quix_command(guarantee: str = "exactly-once", commit_interval_s: float | None = None
                 ) -> list[str]:
    """examples/torture/quix_app.py (a quixstreams Application) as a torture command, run by
    the Python of quixstreams' own environment (created on first use, see app_env)."""
    from labkit.paths import project_root

    if guarantee not in QUIX_GUARANTEES:
        raise HarnessError(f"unknown processing guarantee {guarantee!r}: use one of "
                           f"{', '.join(QUIX_GUARANTEES)}")
    python = app_env("quixstreams", QUIX_REQUIREMENTS)
    command = [str(python), str(project_root() / "examples" / "torture" / "quix_app.py"),
               "--guarantee", guarantee]
    if commit_interval_s is not None:
        command += ["--commit-interval", str(commit_interval_s)]
    return command


FLINK_GUARANTEES = flink_app.GUARANTEES


def flink_command(guarantee: str = "exactly_once", *, interval_ms: int = 500,
                  work_ms: float = 0.0, job: str | Path | None = None,
                  function: str = "fee_job") -> list[str]:
    """A PyFlink job as a torture command (``labkit.flink.app``): the lab's fee job (with
    ``work_ms`` of work per payment), or ``function`` in the file ``job``, its sink's
    delivery guarantee ``guarantee``, a checkpoint every ``interval_ms``. PyFlink's
    environment and the connector's jars are made now, once, not in the first start."""
    if guarantee not in FLINK_GUARANTEES:
        raise HarnessError(f"unknown delivery guarantee {guarantee!r}: use one of "
                           f"{', '.join(FLINK_GUARANTEES)}")
    flink_environment.ready()
    command = [sys.executable, "-m", "labkit.torture.apps", "flink", guarantee,
               "--interval-ms", str(interval_ms), "--function", function]
    if job is not None:
        command += ["--job", str(Path(job).resolve())]
    if work_ms:
        command += ["--work-ms", str(work_ms)]
    return command


# What a learner's function may ask for (by parameter name), as the lab's consume-transform-
# produce worker provides it; the instance id is the one instance's static group member id.
FUNCTION_PROVIDES = ("bootstrap", "input_topic", "output_topic", "group_id", "transactional_id",
                     "instance_id")


def function_command(code_file: str | Path, function: str) -> list[str]:
    """A learner's function (the text of the cell that defines it, saved in ``code_file``) as
    a torture command: it runs in a Python process of its own, called with the run's names
    (``FUNCTION_PROVIDES``), so the harness kills the learner's loop itself, at random."""
    target = learner.from_text(Path(code_file).read_text(), function, str(code_file))
    learner.check_parameters(target, set(FUNCTION_PROVIDES))  # refused before anything runs
    return [sys.executable, "-m", "labkit.torture.apps", "function", str(code_file), function]


def _run_function(code_file: str, function: str) -> None:
    target = learner.from_text(Path(code_file).read_text(), function, code_file)
    env = os.environ
    learner.call(target, bootstrap=env[ENV_BOOTSTRAP], input_topic=env[ENV_INPUT],
                 output_topic=env[ENV_OUTPUT], group_id=env[ENV_GROUP],
                 transactional_id=env[ENV_TRANSACTIONAL_ID], instance_id=f"{env[ENV_GROUP]}-1")


def _behind_proxy(command: list[str]) -> int:
    """Run ``command`` (Kafka's copier) through the lab's proxy and return its exit code.

    The copier has no option for client properties, so against a cluster that wants TLS or
    credentials it talks to a proxy without a fault: plaintext on 127.0.0.1, TLS and SASL
    upstream (``labkit.faults.proxy``). The proxy lives in this process, which the harness
    kills with the copier (the whole process group)."""
    with FaultProxy(settings.current().bootstrap) as proxy:
        env = {**os.environ, ENV_BOOTSTRAP: proxy.bootstrap}
        child = proc.spawn(command, env=env)
        signal.signal(signal.SIGTERM, lambda *_: child.terminate())  # the harness's stop()
        return child.wait()


if __name__ == "__main__":
    # `python -m labkit.torture.apps copier` / `... streams GUARANTEE`: an app the lab did not
    # write as a command line for `labkit torture` (exec, so the harness's SIGKILL hits the
    # JVM itself, not a Python parent).
    if sys.argv[1:] == ["copier"]:
        cmd = copier_command()
        if connection.for_client(settings.current().bootstrap):
            sys.exit(_behind_proxy(cmd))
    elif len(sys.argv) == 3 and sys.argv[1] == "streams" and sys.argv[2] in STREAMS_GUARANTEES:
        cmd = streams_command(sys.argv[2])
    elif sys.argv[1:2] == ["flink"]:
        flink_app.main(sys.argv[2:])  # replaces this process with the job's
    elif len(sys.argv) == 4 and sys.argv[1] == "function":
        _run_function(sys.argv[2], sys.argv[3])  # the learner's loop, in this process
        sys.exit(0)
    else:
        sys.exit("usage: python -m labkit.torture.apps copier   (Kafka's TransactionalMessageCopier)\n"
                 f"       python -m labkit.torture.apps streams {'|'.join(STREAMS_GUARANTEES)}   "
                 "(a Kafka Streams running count, for --check counts)\n"
                 "       python -m labkit.torture.apps flink exactly_once|at_least_once [--help]   "
                 "(a PyFlink job, restored from its latest checkpoint at each start)\n"
                 "       python -m labkit.torture.apps function FILE NAME   (the function NAME "
                 "defined in FILE, a notebook cell's text)\n"
                 "each configured from the LABKIT_* environment that `labkit torture` sets")
    os.execvp(cmd[0], cmd)
