"""One local Kafka broker (or a failure lab's controller) as a process: who it is (node id,
ports, directory, pid and start time), its JVM command line, formatting its storage, starting
it, and its last errors. Which brokers make a cluster and what happens to them is
``labkit.kafka.localcluster``'s; starting and signalling processes is ``labkit.proc``'s."""
from __future__ import annotations

import contextlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from labkit import proc, settings

from labkit.kafka import startup_archive
from labkit.kafka.reach import ClusterError

BROKER_MARK = "kafka.Kafka"  # in every broker JVM's command line (its main class)


@dataclass
class Broker:
    node_id: int
    port: int
    controller_port: int
    dir: str
    pid: int | None = None
    # When that process started: with the pid, its identity (a pid alone may be recycled).
    create_time: float | None = None

    @property
    def running(self) -> bool:
        """Is this broker's process still the one we started, and running?"""
        return proc.alive(self.pid, self.create_time)

    def process(self):
        """Its broker JVM (psutil.Process) if it runs: the pid, started when we started it
        (state files from before start times were kept: a Kafka broker's command line)."""
        return proc.ours(self.pid, self.create_time, BROKER_MARK)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return Path(self.dir) / "broker.log"


def jvm_command(java: str, classpath: str, b: Broker, main: list[str]) -> list[str]:
    """A JVM running ``main`` with this broker's heap, log4j2 file and log directory."""
    now = settings.current()
    return [
        java, f"-Xmx{now.broker_heap}", "-Xms128m", *now.broker_java_opts.split(),
        *startup_archive.options("broker", java, classpath),
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={Path(b.dir) / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={b.dir}",
        "-cp", classpath, *main,
    ]


def format_storage(java: str, classpath: str, b: Broker, cluster_id: str,
                   extra: list[str]) -> None:
    """kafka-storage format of this broker's data dir (``extra``: a secure lab's SCRAM users)."""
    cmd = jvm_command(java, classpath, b, [
        "kafka.tools.StorageTool", "format", "-t", cluster_id,
        "-c", str(Path(b.dir) / "server.properties"), *extra,
    ])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise ClusterError(f"kafka-storage format failed for broker {b.node_id}:\n{out.stdout}{out.stderr}")


def spawn(java: str, classpath: str, b: Broker, owned: bool) -> subprocess.Popen:
    """Start this broker; its pid and start time are recorded on ``b``. ``owned``: it dies
    with this process (a detached lab's brokers outlive it)."""
    cmd = jvm_command(java, classpath, b, ["kafka.Kafka", str(Path(b.dir) / "server.properties")])
    with open(Path(b.dir) / "broker.out", "ab") as out:
        child = proc.spawn(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            group=True,  # Ctrl-C in a notebook or terminal must not hit the broker
            owned=owned,
        )
    b.pid, b.create_time = child.pid, proc.create_time(child.pid)
    return child


def last_errors(broker: Broker, lines: int = 3) -> str:
    """The broker's last ERROR lines, quoted (its directory may be gone when one reads the
    message: a failure lab removes its own)."""
    found: list[str] = []
    for log in (Path(broker.log_file), Path(broker.dir) / "broker.out"):
        with contextlib.suppress(OSError):
            found += [line.strip() for line in log.read_text(errors="replace").splitlines()
                      if "ERROR" in line or "Exception" in line]
    return ("; its last errors:\n  " + "\n  ".join(found[-lines:])) if found else ""
