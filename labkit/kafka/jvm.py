"""The JVM side of the lab: check Java and Maven, resolve the pinned jars from Maven Central.

``jvm/pom.xml`` pins the Kafka broker and Spark's Kafka connector. ``classpath("kafka")``
returns the broker's jars, ``classpath("spark")`` the connector's, ``classpath("tools")``
kafka-tools (Kafka's TransactionalMessageCopier, for ``labkit torture``), ``classpath("streams")``
kafka-streams (a real Kafka Streams app under ``labkit torture``), ``classpath("connect")``
a Kafka Connect worker, ``classpath("flink")`` Flink's Kafka connector (for PyFlink,
``labkit.flink``), resolving them with ``mvn`` into ``.cache/`` the first time (with a
progress line) and reusing them after. ``resolve("debezium")`` puts Debezium's PostgreSQL
connector in a directory of its own under ``plugin_path()``, where a Connect worker loads it
as a plugin (its own class loader).
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from labkit import proc, settings
from labkit.paths import LabkitSetupError, cache_dir, pom_file
from labkit.progress import status

MIN_JAVA = 17
PROFILES = ("kafka", "spark", "tools", "streams", "connect", "debezium", "flink")
# What `labkit setup` fetches; Kafka Connect and Debezium (~40 MB) and Flink's connector
# (~23 MB) come on first use (with the same progress line), for the lessons that need them.
SETUP_PROFILES = ("kafka", "spark", "tools", "streams")
# Connect plugins: each profile's jars in a directory of its own under plugin_path().
CONNECT_PLUGINS = ("debezium",)

_INSTALL_JAVA = (
    "Install a JDK 17 or newer (Debian/Ubuntu: `apt-get install openjdk-17-jdk-headless`; "
    "conda: `conda install -c conda-forge openjdk=17`; macOS: `brew install openjdk@17`), "
    "or point JAVA_HOME at one."
)
_INSTALL_MAVEN = (
    "Maven (`mvn`) is needed once, to fetch the Kafka broker and the Spark connector from "
    "Maven Central. Install it (Debian/Ubuntu: `apt-get install maven`; conda: "
    "`conda install -c conda-forge maven`; macOS: `brew install maven`) and run again."
)


def java_executable() -> str:
    """The java binary: $LABKIT_JAVA, else $JAVA_HOME/bin/java, else java on PATH."""
    explicit = settings.current().java
    if explicit:
        return explicit
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise LabkitSetupError(f"Java was not found. {_INSTALL_JAVA}")
    return found


def parse_java_major(version_output: str) -> int:
    """Major version from `java -version` output ('1.8.0_292' -> 8, '17.0.15' -> 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not match:
        raise LabkitSetupError(f"cannot read the Java version from: {version_output.strip()!r}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java() -> str:
    """Return the java binary after checking it is at least Java 17."""
    java = java_executable()
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise LabkitSetupError(f"Java was not found at {java}. {_INSTALL_JAVA}") from None
    major = parse_java_major(out.stderr + out.stdout)
    if major < MIN_JAVA:
        raise LabkitSetupError(
            f"Java {major} found at {java}, but Kafka 4 and Spark 4 need Java {MIN_JAVA} "
            f"or newer. {_INSTALL_JAVA}"
        )
    return java


def check_maven() -> str:
    mvn = settings.current().mvn or shutil.which("mvn")
    if not mvn or not Path(mvn).exists():
        raise LabkitSetupError(_INSTALL_MAVEN)
    return mvn


def pinned_versions() -> dict[str, str]:
    """The version properties of jvm/pom.xml (kafka.version, spark.version, ...)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    props = ET.parse(pom_file()).getroot().find("m:properties", ns)
    return {el.tag.split("}")[1]: (el.text or "").strip() for el in props} if props is not None else {}


def jar_dir(profile: str) -> Path:
    if profile in CONNECT_PLUGINS:
        return plugin_path() / profile
    return cache_dir() / "jars" / profile


def plugin_path() -> Path:
    """A Connect worker's ``plugin.path``: each directory in it is one plugin, its jars
    loaded by a class loader of their own (so a plugin's Jackson never meets the worker's)."""
    return cache_dir() / "jars" / "connect-plugins"


def is_resolved(profile: str) -> bool:
    """True when the profile's jars are in the cache for the current pom (nothing to fetch)."""
    stamp = jar_dir(profile) / ".resolved"
    return stamp.exists() and stamp.read_text() == pom_file().read_text()


def resolve(profile: str) -> list[Path]:
    """Copy the jars of one pom profile into the cache (once) and return them."""
    if profile not in PROFILES:
        raise ValueError(f"unknown jar set {profile!r}; choose one of {', '.join(PROFILES)}")
    target = jar_dir(profile)
    if not is_resolved(profile):
        check_java()
        mvn = check_maven()
        # One process fetches a profile at a time: two test workers (or two kernels) that
        # both found it missing copied into one directory, and Maven's copy failed under
        # the other's feet. The second waits, then finds it resolved.
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{profile}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if we die
            if not is_resolved(profile):
                if target.exists():
                    shutil.rmtree(target)
                # Maven's own local repository (~/.m2 unless the user's settings say
                # otherwise): a second clone, or CI's fresh one, copies the jars from there
                # instead of downloading 200 MB from Maven Central again.
                cmd = [
                    mvn, "-B", f"-P{profile}", "-f", str(pom_file()),
                    "dependency:copy-dependencies", f"-DoutputDirectory={target}",
                ]
                _run_maven(cmd, f"Fetching the {profile} jars from Maven Central")
                (target / ".resolved").write_text(pom_file().read_text())
    return sorted(target.glob("*.jar"))


def _run_maven(cmd: list[str], title: str) -> None:
    """Run mvn, turning its download log into a one-line progress display."""
    lines: list[str] = []
    downloads = 0
    with status(title) as update:
        mvn = proc.spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert mvn.stdout is not None
        try:
            for line in mvn.stdout:
                lines.append(line)
                if "Downloaded from" in line:
                    downloads += 1
                    artifact = line.rsplit("/", 1)[-1].split(" ")[0]
                    update(f"{title}: {downloads} files, last {artifact}")
            code = mvn.wait()
        except BaseException:  # Ctrl-C in a notebook: Maven's JVM must not download on alone
            proc.stop([mvn], timeout_s=5)
            raise
    if code != 0:
        errors = "".join(l for l in lines if "[ERROR]" in l)[-3000:]
        raise LabkitSetupError(
            f"mvn could not resolve the {title.split()[2]} jars (exit {code}). Maven Central "
            f"must be reachable. Maven said:\n{errors}"
        )


def classpath(profile: str) -> str:
    return os.pathsep.join(str(p) for p in resolve(profile))


STREAMS_APP = "StreamsRunningCount.java"


def streams_app(*args: str) -> list[str]:
    """examples/torture/StreamsRunningCount.java (a running count in real Kafka Streams) with
    ``args``, as a command: Java 17's single-file launcher compiles it in memory at each
    start (no build step), on the kafka-streams jars (resolved once). The app reads the
    LABKIT_* environment itself; ``labkit.torture.apps.streams_command`` and the
    ``streams-restore`` experiment choose its arguments."""
    from labkit.paths import project_root

    java = check_java()
    resolve("streams")
    return [java, "-Xmx256m", *settings.SHORT_LIVED_JVM.split(),
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            # a classpath wildcard (expanded by java itself) keeps the command readable
            "-cp", str(jar_dir("streams") / "*"),
            str(project_root() / "examples" / "torture" / STREAMS_APP), *args]
