"""The one place that reads the ``LABKIT_*`` environment.

Every other module asks ``settings.current()`` (a snapshot read when called, never at import
time, so a notebook or a test that sets a variable sees it on the next call). Two kinds of
variable live here:

* **what a user sets** to point the lab elsewhere: the cluster (``LABKIT_BOOTSTRAP``), its
  credentials (``LABKIT_KAFKA_CONFIG``), a learner's namespace on a shared cluster
  (``LABKIT_NAMESPACE``), where things are kept, how big the JVMs are, Spark Connect;
* **what the lab sets for processes it starts** (a crash point to arm, the history file, the
  instance number): the runner writes them into a child's environment and the child reads
  them back through the same snapshot.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# What the runner sets for the processes it starts.
CRASH_AT, CRASH_HIT, CRASH_STALL = "LABKIT_CRASH_AT", "LABKIT_CRASH_HIT", "LABKIT_CRASH_STALL"
HISTORY, INSTANCE, ATTEMPT = "LABKIT_HISTORY", "LABKIT_INSTANCE", "LABKIT_ATTEMPT"
# What `labkit torture` sets for a learner's own app.
BOOTSTRAP, KAFKA_CONFIG = "LABKIT_BOOTSTRAP", "LABKIT_KAFKA_CONFIG"
INPUT_TOPIC, OUTPUT_TOPIC = "LABKIT_INPUT_TOPIC", "LABKIT_OUTPUT_TOPIC"
GROUP_ID, TRANSACTIONAL_ID = "LABKIT_GROUP_ID", "LABKIT_TRANSACTIONAL_ID"
INSTANCE_ID = "LABKIT_INSTANCE_ID"  # an app instance's own group.instance.id, if it wants one
# The Java client properties translated from LABKIT_KAFKA_CONFIG, for a Java app under torture.
KAFKA_JAVA_CONFIG = "LABKIT_KAFKA_JAVA_CONFIG"
# Addresses that speak plaintext whatever LABKIT_KAFKA_CONFIG says (a fault proxy's client
# side), kept in the environment so every process the lab starts inherits the list.
PLAINTEXT = "LABKIT_PLAINTEXT"
SPARK_REMOTE = "LABKIT_SPARK_REMOTE"
NAMESPACE = "LABKIT_NAMESPACE"
ROOM = "LABKIT_ROOM"


class SettingsError(ValueError):
    """A LABKIT_* variable holds something the lab cannot use; the message says what to set."""


# The lab's JVMs (brokers, Spark drivers, the Streams app) live minutes and move little data:
# C1 only and the serial GC halve the CPU of a broker's start (12 s -> 6.5 s measured), which
# a 2-core laptop feels.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@dataclass(frozen=True)
class Settings:
    # where the lab's cluster is and how to talk to it
    bootstrap: str                 # LABKIT_BOOTSTRAP: an external cluster; "" for the local lab
    kafka_config: Path | None      # LABKIT_KAFKA_CONFIG: librdkafka properties for every client
    namespace_set: str             # LABKIT_NAMESPACE as written ("" when unset)
    # where things are kept
    project: Path | None           # LABKIT_PROJECT: the checkout (found automatically)
    cache: Path | None             # LABKIT_CACHE: jars, startup archives, app envs
    home: Path | None              # LABKIT_HOME: running clusters, logs, state
    # the JVMs the lab starts
    java: str                      # LABKIT_JAVA: the java binary ("" = JAVA_HOME / PATH)
    mvn: str                       # LABKIT_MVN: the mvn binary ("" = PATH)
    broker_heap: str               # LABKIT_BROKER_HEAP
    broker_java_opts: str          # LABKIT_BROKER_JAVA_OPTS: JIT and GC of every broker JVM
    spark_master: str              # LABKIT_SPARK_MASTER
    spark_memory: str              # LABKIT_SPARK_MEMORY: the local driver's heap
    spark_server_memory: str       # LABKIT_SPARK_SERVER_MEMORY: a shared Connect server's heap
    spark_jars: str                # LABKIT_SPARK_JARS: replaces the pinned connector jars
    spark_java_opts: str           # LABKIT_SPARK_JAVA_OPTS: the crash experiments' drivers
    spark_remote_set: str          # LABKIT_SPARK_REMOTE as written
    pg_dsn: str                    # LABKIT_PG_DSN: your PostgreSQL instead of the lab's
    widgets: str                   # LABKIT_WIDGETS: live | static | "" (guess)
    room: str                      # LABKIT_ROOM: publish exercise results to this room's board
    # set by the lab for the processes it starts
    crash_at: str
    crash_hit: int
    crash_stall: bool
    history_file: str
    instance: str
    attempt: int
    plaintext: frozenset[str] = frozenset()  # LABKIT_PLAINTEXT: host:port, comma-separated
    # LABKIT_NAMESPACE is in the environment, perhaps empty: set empty, it means "no
    # namespace" even on an external cluster (the test suite's own names, a lone user)
    namespace_given: bool = False

    @property
    def external(self) -> bool:
        return bool(self.bootstrap)

    @property
    def spark_remote(self) -> str | None:
        """A Spark Connect server (``sc://host:port``) the Spark lessons use, None for local."""
        url = self.spark_remote_set
        if not url:
            return None
        if not url.startswith("sc://"):
            raise SettingsError(f"LABKIT_SPARK_REMOTE={url!r} is not a Spark Connect address: "
                                "use sc://host:port (e.g. sc://127.0.0.1:15002, what "
                                "`labkit spark-server` prints), or unset it for a local Spark")
        return url


def checked_namespace(name: str, source: str = "LABKIT_NAMESPACE") -> str:
    """``name`` if it can prefix Kafka names (no '.', which separates it); else the error."""
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_-]{0,39}", name):
        fix = "" if source == "LABKIT_NAMESPACE" else " in a namespace; set LABKIT_NAMESPACE"
        raise SettingsError(f"{source}={name!r}: use letters, digits, '-' and '_' (at most 40, "
                            f"starting with a letter or digit){fix}, e.g. alice")
    return name


def _path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else default
    except ValueError:
        raise SettingsError(f"{name}={value!r} is not a whole number") from None


def current() -> Settings:
    """The LABKIT_* environment now (cheap: a handful of dictionary lookups)."""
    env = os.environ
    return Settings(
        bootstrap=env.get(BOOTSTRAP, "").strip(),
        kafka_config=_path(KAFKA_CONFIG),
        namespace_set=env.get(NAMESPACE, "").strip(),
        project=_path("LABKIT_PROJECT"),
        cache=_path("LABKIT_CACHE"),
        home=_path("LABKIT_HOME"),
        java=env.get("LABKIT_JAVA", "").strip(),
        mvn=env.get("LABKIT_MVN", "").strip(),
        broker_heap=env.get("LABKIT_BROKER_HEAP", "").strip() or "512m",
        broker_java_opts=env.get("LABKIT_BROKER_JAVA_OPTS", "").strip() or SHORT_LIVED_JVM,
        spark_master=env.get("LABKIT_SPARK_MASTER", "").strip() or "local[2,4]",
        spark_memory=env.get("LABKIT_SPARK_MEMORY", "").strip() or "1g",
        spark_server_memory=env.get("LABKIT_SPARK_SERVER_MEMORY", "").strip() or "2g",
        spark_jars=env.get("LABKIT_SPARK_JARS", "").strip(),
        spark_java_opts=env.get("LABKIT_SPARK_JAVA_OPTS", "").strip() or SHORT_LIVED_JVM,
        spark_remote_set=env.get(SPARK_REMOTE, "").strip(),
        pg_dsn=env.get("LABKIT_PG_DSN", "").strip(),
        widgets=env.get("LABKIT_WIDGETS", "").strip().lower(),
        room=env.get(ROOM, "").strip(),
        crash_at=env.get(CRASH_AT, ""),
        crash_hit=_int(CRASH_HIT, 1),
        crash_stall=bool(env.get(CRASH_STALL)),
        history_file=env.get(HISTORY, ""),
        instance=env.get(INSTANCE, ""),
        attempt=_int(ATTEMPT, 1),
        namespace_given=NAMESPACE in env,
        plaintext=_addresses(env.get(PLAINTEXT, "")),
    )


def _addresses(text: str) -> frozenset[str]:
    return frozenset(a.strip() for a in text.split(",") if a.strip())


def connection_env() -> dict[str, str | None]:
    """This process's connection variables (LABKIT_KAFKA_CONFIG, LABKIT_PLAINTEXT,
    LABKIT_NAMESPACE; None when unset, which differs from a namespace set empty), for a
    long-lived child started earlier (a warm Spark worker) to apply per job
    (``apply_connection_env``)."""
    return {name: os.environ.get(name) for name in (KAFKA_CONFIG, PLAINTEXT, NAMESPACE)}


def apply_connection_env(env: dict[str, str | None]) -> None:
    """In the child: make this process's connection variables what ``env`` says."""
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def mark_plaintext(addresses: str) -> None:
    """Record that ``addresses`` (``host:port[,host:port]``) speak plaintext (a fault proxy's
    listeners): clients pointed there get no LABKIT_KAFKA_CONFIG settings. Written to this
    process's environment, so child processes started afterwards (workers, apps) know too."""
    os.environ[PLAINTEXT] = ",".join(sorted(current().plaintext | _addresses(addresses)))


def unmark_plaintext(addresses: str) -> None:
    """Undo ``mark_plaintext`` (the proxy stopped; its ports may be reused by anything)."""
    left = current().plaintext - _addresses(addresses)
    if left:
        os.environ[PLAINTEXT] = ",".join(sorted(left))
    else:
        os.environ.pop(PLAINTEXT, None)
