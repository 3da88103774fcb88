"""A Spark Connect server for a room: one shared Spark driver, the Kafka connector on it.

    with ConnectServer(port=15002) as server:     # `labkit spark-server` does the same
        os.environ["LABKIT_SPARK_REMOTE"] = server.url   # sc://127.0.0.1:15002

The server is Spark's own ``org.apache.spark.sql.connect.service.SparkConnectServer``, run
by pip pyspark's ``spark-submit`` (pyspark ships ``spark-connect_2.13`` in its jars) with the
lab's connector jars (``jvm.resolve("spark")``) on its classpath. It listens on 127.0.0.1
only (a room reaches it through whatever the instructor puts in front, e.g. the compose
network); its Spark UI, on a port of its own, lists every learner's queries.

What runs where (see docs/spark-connect.md, "A shared Spark for a room"): with
LABKIT_SPARK_REMOTE set, ``labkit.spark.session()`` returns a Connect session, so batch
work (reading Kafka, the audit's recount) runs on the server. A crash experiment does not: it SIGKILLs the
driver, and a shared driver is not the learner's to kill; besides, Connect runs a
``foreachBatch`` function in a Python process the *server* starts, on the server's machine,
without the learner's environment (so crash points armed there never fire) and against
the server's files (not the learner's checkpoint or SQLite file). Those experiments keep a
local driver (``labkit.spark.runner``) and say so.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pyspark

from labkit import settings

from labkit.kafka import jvm
from labkit import proc
from labkit.kafka.ports import PortInUseError, port_is_free
from labkit.paths import lab_home, spark_remote
from labkit.progress import status

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002  # Spark Connect's own default
HOST = "127.0.0.1"
READY_TIMEOUT_S = 240.0  # ~30 s on a loaded 2-core machine; the first start also resolves jars
STOP_TIMEOUT_S = 30.0


class ConnectServerError(RuntimeError):
    """The server did not start or stopped by itself; the message says what its log says."""


def remote_url() -> str | None:
    """The Spark Connect address the lessons use (LABKIT_SPARK_REMOTE), None for local Spark."""
    return spark_remote()


def _spark_submit() -> Path:
    """pip pyspark's own spark-submit: the server runs the very Spark the clients speak."""
    return Path(pyspark.__file__).parent / "bin" / "spark-submit"


def _accepts(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


class ConnectServer:
    """One Spark Connect server as a child process (its own process group), stopped on exit.

    ``ui_port``: where its Spark UI listens (127.0.0.1); None picks a free one.
    ``profiles``: the jar sets of jvm/pom.xml on its classpath (the Kafka connector's, "spark").
    """

    def __init__(self, port: int = DEFAULT_PORT, *, ui_port: int | None = None,
                 log_dir: str | Path | None = None, memory: str | None = None,
                 profiles: Sequence[str] = ("spark",)):
        self.port = port
        self.ui_port = ui_port
        self.log_dir = Path(log_dir) if log_dir else lab_home() / "spark-connect"
        self.memory = memory or settings.current().spark_server_memory  # a room's queries share it
        self.profiles = tuple(profiles)
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"sc://{HOST}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.ui_port}"

    @property
    def log_file(self) -> Path:
        return self.log_dir / f"server-{self.port}.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self, jars: Sequence[Path]) -> list[str]:
        conf = {
            "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.memory": self.memory,
            "spark.driver.bindAddress": HOST,
            "spark.driver.host": HOST,
            "spark.ui.port": str(self.ui_port),
            "spark.ui.showConsoleProgress": "false",
            # The lab's local settings (labkit.spark.session): small data, 2 cores.
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        }
        cmd = [str(_spark_submit()), "--class", SERVER_CLASS, "--name", f"labkit Spark Connect :{self.port}",
               "--master", "local[2]", "--jars", ",".join(str(j) for j in jars)]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd + ["spark-internal"]  # spark-submit's name for "the class is on the classpath"

    def start(self) -> "ConnectServer":
        if self.alive:
            return self
        if not port_is_free(self.port):
            raise PortInUseError(f"port {self.port} is in use (another Spark Connect server?): "
                                 f"pass another one (labkit spark-server --port N) or stop it")
        java = jvm.check_java()
        jars = [j for profile in self.profiles for j in jvm.resolve(profile)]
        if self.ui_port is None:
            with socket.socket() as s:  # any free port: a room server's UI, never a clash
                s.bind((HOST, 0))
                self.ui_port = s.getsockname()[1]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ,
               "SPARK_HOME": str(_spark_submit().parents[1]),
               "JAVA_HOME": os.path.dirname(os.path.dirname(os.path.realpath(java))),
               # foreachBatch functions and Python UDFs run in Python processes the server
               # starts: this interpreter has pyspark and labkit.
               "PYSPARK_PYTHON": sys.executable,
               "SPARK_LOCAL_IP": HOST,  # the UI and block manager bind to loopback too
               "SPARK_SUBMIT_OPTS": "-Dlog4j2.level=WARN"}  # the log says what goes wrong
        for client_only in (settings.SPARK_REMOTE, "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
            env.pop(client_only, None)  # the server is a driver, not a Connect client
        started = time.monotonic()
        with open(self.log_file, "ab") as log:
            self.proc = proc.spawn(  # it dies with its owner (a kernel, a test)
                self.command(jars), env=env, cwd=self.log_dir, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
                group=True)  # its own group: stop() reaches spark-submit's children
        try:
            self._wait_ready(started)
        except BaseException:  # also Ctrl-C while waiting: never leave the JVM behind
            self.stop()
            raise
        self.startup_s = round(time.monotonic() - started, 1)
        return self

    def _wait_ready(self, started: float) -> None:
        title = f"Starting a Spark Connect server on {self.url} (log: {self.log_file})"
        with status(title) as update:
            while not _accepts(self.port):
                if self.proc.poll() is not None:
                    raise ConnectServerError(
                        f"the Spark Connect server exited with code {self.proc.returncode} "
                        f"before listening; its log {self.log_file} ends with:\n{self.log_tail()}")
                waited = time.monotonic() - started
                if waited > READY_TIMEOUT_S:
                    raise ConnectServerError(
                        f"the Spark Connect server did not listen on {self.port} within "
                        f"{READY_TIMEOUT_S:.0f} s; see {self.log_file}")
                update(f"{title}: {waited:.0f} s")
                time.sleep(0.25)

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM the server's process group (Spark stops its session and Python workers),
        SIGKILL it if it has not exited within STOP_TIMEOUT_S."""
        if self.proc is None:
            return
        # The group may outlive its leader briefly (the foreachBatch Python workers): it
        # gets the SIGKILL whatever happened.
        proc.stop([self.proc], STOP_TIMEOUT_S, group=True, kill_wait_s=STOP_TIMEOUT_S)
        self.proc = None

    def serve(self) -> int:
        """Block until the server exits by itself (its exit code) or Ctrl-C / SIGTERM (0,
        stopped)."""
        def interrupt(signum, frame):  # a supervisor's SIGTERM stops the server like Ctrl-C
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, interrupt)
        try:
            return self.proc.wait()
        except KeyboardInterrupt:
            return 0
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.stop()

    def __enter__(self) -> "ConnectServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
