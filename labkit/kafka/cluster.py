"""The lab's Kafka: real Apache Kafka brokers (KRaft) as child processes, or an external cluster.

    with LocalCluster(brokers=1) as cluster:      # start, wait ready, stop on exit
        cluster.bootstrap                         # '127.0.0.1:41234'
        cluster.kill()                            # SIGKILL: nothing flushed, nothing closed
        cluster.restart()                         # same data dir: acknowledged data is back

``ensure()`` is what notebooks call: the cluster named by ``LABKIT_BOOTSTRAP`` if set, else
the lab cluster ``labkit up`` started, else a new one owned by this Python process.

No orphans: an owned broker gets SIGKILL from the kernel when its owner dies
(PR_SET_PDEATHSIG), and ``atexit`` stops it cleanly on a normal exit. A detached lab
(``labkit up``) outlives the CLI; its pids, each with its process's start time (a recycled
pid is not our broker), live in ``$LABKIT_HOME/cluster.json`` and a lab whose brokers or
owner died is detected there and cleaned up by the next start. Starting, signalling and
waiting for processes is ``labkit.proc``'s job.
"""
from __future__ import annotations

import atexit
import base64
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from labkit import proc, settings

from labkit.kafka import jvm
from labkit.kafka import secure as secure_lab
from labkit.kafka.clientlog import client_config
from labkit.paths import lab_home
from labkit.progress import status

READY_TIMEOUT_S = 90.0
STATE_FILE = "cluster.json"


class ClusterError(RuntimeError):
    """The cluster cannot do what was asked; the message says what to do instead."""


class PortInUseError(ClusterError):
    pass


class AuthenticationFailed(ClusterError):
    """The cluster refused this client's credentials (or it sent none to a SASL_SSL port)."""


# --------------------------------------------------------------------------- helpers


# Brokers take ports below Linux's ephemeral range (32768-60999 by default): a port there is
# never handed to a client connection as its source port or to a port-0 listener (a proxy,
# JupyterLab), so a broker killed and restarted finds its port still free.
BROKER_PORT_RANGE = (20000, 32000)


def free_port() -> int:
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(*BROKER_PORT_RANGE)
        if port_is_free(port):
            return port
    with socket.socket() as s:  # that whole range busy: any free port will do
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


BROKER_MARK = "kafka.Kafka"  # in every broker JVM's command line (its main class)


def new_cluster_id() -> str:
    """A KRaft cluster id: a base64url UUID that does not start with '-' (the storage tool
    would read that as an option; Kafka's own Uuid.randomUuid() avoids it the same way)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def check_reachable(bootstrap: str, timeout_s: float = 10.0, expect_brokers: int = 1,
                    identity: dict[str, str] | None = None) -> dict[int, str]:
    """Metadata from the cluster, or ClusterError saying it is not reachable
    (AuthenticationFailed: it answers but refuses this client's credentials, or lack of them).

    ``identity``: connection settings that replace LABKIT_KAFKA_CONFIG's (the lab's admin)."""
    refused: list[str] = []  # what librdkafka said about authentication, from its error_cb

    def on_error(err) -> None:
        if secure_lab.looks_like_auth_failure(f"{err.name()} {err.str()}"):
            refused.append(err.str())

    admin = AdminClient(client_config({"bootstrap.servers": bootstrap,
                                       "socket.connection.setup.timeout.ms": 2000,
                                       "error_cb": on_error, **(identity or {}),
                                       "log_level": 0}))  # connection-refused noise while it starts
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        admin.poll(0)  # serves error_cb
        if refused:  # credentials do not heal by waiting: say so at once
            raise AuthenticationFailed(f"{secure_lab.auth_message(lab_home())} (Kafka at {bootstrap}: "
                                       f"{refused[-1]})")
        try:
            md = admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            brokers = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
            if len(brokers) >= expect_brokers and md.controller_id >= 0:
                return brokers
        except Exception as exc:  # KafkaException while it is still coming up
            last_error = exc
        time.sleep(0.2)
    if identity is None and settings.current().kafka_config is None and _accepts(bootstrap):
        # It takes connections but never answers a plaintext client without credentials:
        # most likely a TLS/SASL listener (librdkafka only says "transport failure").
        raise AuthenticationFailed(
            f"{secure_lab.auth_message(lab_home())} (Kafka at {bootstrap} accepts connections "
            "but answers no plaintext client without credentials)")
    raise ClusterError(
        f"Kafka at {bootstrap} is not reachable (no metadata within {timeout_s:.0f} s"
        f"{': ' + str(last_error) if last_error else ''}). Check the address and that the "
        "broker runs; unset LABKIT_BOOTSTRAP to use a local lab broker instead."
    )


def _accepts(bootstrap: str) -> bool:
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


# --------------------------------------------------------------------------- brokers


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


# A failure lab (``LocalCluster(controller="dedicated")``): the KRaft quorum is one node of
# its own, so freezing two brokers never takes the quorum with them and the controller can
# still shrink ISRs and elect leaders. Its timings are short so a lesson sees each step in
# seconds: a follower that fetched nothing for 4 s leaves the ISR (Kafka: 30 s); a broker
# silent for 4 s is fenced and its partitions move (Kafka: 9 s).
FAILURE_LAB_PROPERTIES = {
    "replica.lag.time.max.ms": 4000,
    "broker.session.timeout.ms": 4000,
    "broker.heartbeat.interval.ms": 500,
    # An inter-broker request to a broker that has just died (a transaction marker) is
    # given up and sent again only after this: measured, Kafka's 30 s stalled the next
    # transaction after a coordinator failover for 30 s, 5 s for ~7 s.
    "request.timeout.ms": 5000,
}
CONTROLLER_NODE_ID = 100


def controller_properties(node: Broker, voters: str) -> str:
    """A controller-only KRaft node (the quorum of a failure lab)."""
    return "\n".join([
        "process.roles=controller",
        f"node.id={node.node_id}",
        f"controller.quorum.voters={voters}",
        f"listeners=CONTROLLER://127.0.0.1:{node.controller_port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT",
        f"log.dirs={Path(node.dir) / 'data'}",
        *(f"{k}={v}" for k, v in FAILURE_LAB_PROPERTIES.items()),
        "",
    ])


def broker_properties(broker: Broker, voters: str, n_brokers: int,
                      listeners: list[str] | None = None, dedicated_controller: bool = False,
                      extra: dict[str, object] | None = None) -> str:
    """``listeners``: the listener lines of a secure lab (``labkit.kafka.secure``), else plaintext.
    ``dedicated_controller``: a broker-only node of a failure lab (the quorum runs apart).
    ``extra``: settings a private lab's experiment needs (they come last, so they win)."""
    replicated = n_brokers >= 3
    rf, min_isr = (3, 2) if replicated else (1, 1)
    own_listeners = (
        [f"listeners=PLAINTEXT://127.0.0.1:{broker.port}"] if dedicated_controller else
        [f"listeners=PLAINTEXT://127.0.0.1:{broker.port},CONTROLLER://127.0.0.1:{broker.controller_port}"])
    return "\n".join([
        "process.roles=broker" if dedicated_controller else "process.roles=broker,controller",
        f"node.id={broker.node_id}",
        f"controller.quorum.voters={voters}",
        *(listeners or [
            *own_listeners,
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{broker.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        ]),
        *(f"{k}={v}" for k, v in FAILURE_LAB_PROPERTIES.items() if dedicated_controller),
        f"log.dirs={Path(broker.dir) / 'data'}",
        f"default.replication.factor={rf}",
        f"min.insync.replicas={min_isr}",
        f"offsets.topic.replication.factor={rf}",
        f"transaction.state.log.replication.factor={rf}",
        f"transaction.state.log.min.isr={min_isr}",
        # Share groups (KIP-932): the share coordinator's state topic __share_group_state
        # asks for 3 replicas by default, which one broker cannot create
        # (INVALID_REPLICATION_FACTOR), so it is sized like the two topics above.
        f"share.coordinator.state.topic.replication.factor={rf}",
        f"share.coordinator.state.topic.min.isr={min_isr}",
        "share.coordinator.state.topic.num.partitions=5",
        # Record lock 10 s (Kafka: 30 s). A killed consumer's records come back when its
        # connection drops, not when the lock expires; the lock only frees the records of a
        # consumer that is alive but stuck, and must outlast a slow one's work on a loaded
        # laptop (at 2 s, acks came too late: INVALID_RECORD_STATE, records processed twice).
        # The minimum is lowered (15 s -> 1 s) so a lesson can set a short lock per group
        # (share.record.lock.duration.ms). Delivery limit: Kafka's default 5, written out
        # because the lessons cite it.
        "group.share.min.record.lock.duration.ms=1000",
        "group.share.record.lock.duration.ms=10000",
        "group.share.delivery.count.limit=5",
        # A share consumer gets its assignment on its second heartbeat: 1 s instead of 5 s
        # (Kafka's default) to its first record; a dead member leaves after 6 s, like the
        # consumer groups above.
        "group.share.min.heartbeat.interval.ms=1000",
        "group.share.heartbeat.interval.ms=1000",
        "group.share.min.session.timeout.ms=6000",
        "group.share.session.timeout.ms=6000",
        # Lab-sized internals: fewer partitions start faster on a laptop.
        "offsets.topic.num.partitions=5",
        "transaction.state.log.num.partitions=5",
        # A lone consumer gets its partitions at once instead of after 3 s.
        "group.initial.rebalance.delay.ms=0",
        # Both group protocols notice a dead member after 6 s (the classic protocol's client
        # asks for that; the KIP-848 consumer protocol takes it from the broker, 45 s by
        # default), so the two can be compared in a lesson.
        "group.consumer.min.session.timeout.ms=6000",
        "group.consumer.session.timeout.ms=6000",
        "group.consumer.min.heartbeat.interval.ms=1000",
        "group.consumer.heartbeat.interval.ms=1000",
        # Timed-out (hanging) transactions are aborted within ~1 s instead of ~10 s.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000",
        "auto.create.topics.enable=true",
        *(f"{k}={v}" for k, v in (extra or {}).items()),
        "",
    ])


LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
"""


# --------------------------------------------------------------------------- clusters


@dataclass
class ExternalCluster:
    """A cluster the lab does not run (docker-compose, a workshop server)."""

    bootstrap: str
    external: bool = field(default=True, init=False)

    def wait_ready(self, timeout_s: float = 15.0) -> dict[int, str]:
        return check_reachable(self.bootstrap, timeout_s)

    def _refuse(self, what: str):
        raise ClusterError(
            f"cannot {what} an external cluster ({self.bootstrap}); crash the broker with "
            "your own tools, or unset LABKIT_BOOTSTRAP to run the lab's own brokers."
        )

    def kill(self, node_id: int | None = None) -> None:
        self._refuse("kill a broker of")

    def restart(self, node_id: int | None = None) -> None:
        self._refuse("restart a broker of")

    def stop(self) -> None:
        """Nothing to stop: the lab did not start it."""

    def info(self) -> dict:
        return {"bootstrap": self.bootstrap, "external": True, "up": True,
                "brokers": self.wait_ready()}


def _last_errors(broker: Broker, lines: int = 3) -> str:
    """The broker's last ERROR lines, quoted (its directory may be gone when one reads the
    message: a failure lab removes its own)."""
    found: list[str] = []
    for log in (Path(broker.log_file), Path(broker.dir) / "broker.out"):
        with contextlib.suppress(OSError):
            found += [line.strip() for line in log.read_text(errors="replace").splitlines()
                      if "ERROR" in line or "Exception" in line]
    return ("; its last errors:\n  " + "\n  ".join(found[-lines:])) if found else ""


class LocalCluster:
    """1 or 3 real Kafka brokers in KRaft combined mode, each a child JVM."""

    external = False

    def __init__(self, brokers: int = 1, home: Path | None = None, port: int | None = None,
                 detached: bool = False, secure: bool = False, controller: str = "combined",
                 properties: dict[str, object] | None = None):
        if brokers not in (1, 3):
            raise ValueError(f"brokers must be 1 or 3, not {brokers}")
        if controller not in ("combined", "dedicated"):
            raise ValueError(f"controller must be 'combined' or 'dedicated', not {controller!r}")
        if controller == "dedicated" and (brokers != 3 or secure):
            raise ValueError("a dedicated controller is for the plaintext 3-broker failure lab")
        self.home = Path(home) if home else lab_home()
        # secure: clients reach it on SASL_SSL only, with the credentials in client_properties
        self.security = secure_lab.SecureLab(self.home) if secure else None
        self.detached = detached
        self.owner_pid = os.getpid()
        self._procs: dict[int, subprocess.Popen] = {}
        self.brokers = [
            Broker(node_id=i + 1, port=0, controller_port=0, dir=str(self.home / f"node-{i + 1}"))
            for i in range(brokers)
        ]
        # The failure lab's quorum: one controller-only node beside the brokers (else each
        # broker is also a controller voter).
        self.controller = (Broker(node_id=CONTROLLER_NODE_ID, port=0, controller_port=0,
                                  dir=str(self.home / "controller"))
                           if controller == "dedicated" else None)
        self._requested_port = port
        self.properties = dict(properties or {})  # added to every broker's server.properties

    @property
    def nodes(self) -> list[Broker]:
        """Every process of this lab: the brokers, and a failure lab's controller."""
        return self.brokers + ([self.controller] if self.controller else [])

    # -- addresses ----------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    @property
    def secure(self) -> bool:
        return self.security is not None

    @property
    def client_properties(self) -> Path | None:
        """The file LABKIT_KAFKA_CONFIG must name to use a secure lab (None: plaintext)."""
        return self.security.client_file if self.security else None

    def _identity(self) -> dict[str, str]:
        """The lab's own credentials for its own checks: a secure lab's admin; for a plaintext
        lab none ({}: also no guess that a slow broker wants credentials)."""
        return self.security.admin_config() if self.security else {}

    def broker(self, node_id: int) -> Broker:
        for b in self.brokers:
            if b.node_id == node_id:
                return b
        raise ClusterError(f"no broker {node_id}; brokers are {[b.node_id for b in self.brokers]}")

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> "LocalCluster":
        java = jvm.check_java()
        classpath = jvm.classpath("kafka")
        self._assign_ports()
        voters = ",".join(f"{b.node_id}@127.0.0.1:{b.controller_port}"
                          for b in ([self.controller] if self.controller else self.brokers))
        cluster_id = new_cluster_id()
        with status(f"Starting {len(self.brokers)} Kafka broker(s)") as update:
            try:
                if self.security:
                    update("Making a CA, a broker certificate and SCRAM users")
                    self.security.prepare()
                for b in self.nodes:
                    d = Path(b.dir)
                    if d.exists():
                        shutil.rmtree(d)
                    (d / "data").mkdir(parents=True)
                    listeners = (self.security.listener_properties(b.port, b.controller_port)
                                 if self.security else None)
                    (d / "server.properties").write_text(
                        controller_properties(b, voters) if b is self.controller else
                        broker_properties(b, voters, len(self.brokers), listeners,
                                          dedicated_controller=self.controller is not None,
                                          extra=self.properties))
                    if self.security:  # its JAAS line holds the admin's password
                        (d / "server.properties").chmod(0o600)
                    (d / "log4j2.properties").write_text(LOG4J2.format(log=b.log_file))
                    update(f"Formatting storage of broker {b.node_id}")
                    self._format(java, classpath, b, cluster_id)
                for b in self.nodes:
                    update(f"Starting {'controller' if b is self.controller else 'broker'} "
                           f"{b.node_id} on {b.address}")
                    self._spawn(java, classpath, b)
                self._save_state()
                update(f"Waiting for {len(self.brokers)} broker(s) to answer metadata")
                self.wait_ready()
                if self.security:
                    update("Granting the learner user its ACLs")
                    self.security.grant_learner(self.bootstrap)
            except BaseException:
                # A start that fails half-way (a broker that never answers, Ctrl-C) must not
                # leave the brokers it did spawn running with no one to stop them.
                self.stop(timeout_s=5)
                raise
        if not self.detached:
            atexit.register(self._stop_at_exit)
        return self

    def _assign_ports(self) -> None:
        if self._requested_port:
            wanted = [self._requested_port + i for i in range(len(self.brokers))]
            for p in wanted:
                if not port_is_free(p):
                    raise PortInUseError(
                        f"port {p} on 127.0.0.1 is already in use by another process. Stop it "
                        "(`labkit down` if it is an older lab), choose another port with "
                        "--port, or omit --port to pick free ports."
                    )
        else:
            wanted = [free_port() for _ in self.brokers]
        taken = set(wanted)

        def untaken() -> int:
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            return port

        for b, p in zip(self.brokers, wanted):
            b.port = p
            b.controller_port = untaken()
        if self.controller:
            self.controller.port = self.controller.controller_port = untaken()

    def _jvm_command(self, java: str, classpath: str, b: Broker, main: list[str]) -> list[str]:
        return [
            java, f"-Xmx{settings.current().broker_heap}", "-Xms128m", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={Path(b.dir) / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={b.dir}",
            "-cp", classpath, *main,
        ]

    def _format(self, java: str, classpath: str, b: Broker, cluster_id: str) -> None:
        cmd = self._jvm_command(java, classpath, b, [
            "kafka.tools.StorageTool", "format", "-t", cluster_id,
            "-c", str(Path(b.dir) / "server.properties"),
            *(self.security.format_arguments() if self.security else []),
        ])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise ClusterError(f"kafka-storage format failed for broker {b.node_id}:\n{out.stdout}{out.stderr}")

    def _spawn(self, java: str, classpath: str, b: Broker) -> None:
        cmd = self._jvm_command(java, classpath, b, ["kafka.Kafka", str(Path(b.dir) / "server.properties")])
        with open(Path(b.dir) / "broker.out", "ab") as out:
            child = proc.spawn(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                group=True,  # Ctrl-C in a notebook or terminal must not hit the broker
                owned=not self.detached,  # an owned broker dies with its owner
            )
        self._procs[b.node_id] = child
        b.pid, b.create_time = child.pid, proc.create_time(child.pid)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict[int, str]:
        alive = [b for b in self.brokers if b.running]
        deadline = time.monotonic() + timeout_s
        while True:
            for b in alive:
                if not b.running:
                    raise ClusterError(
                        f"broker {b.node_id} exited while starting; see {b.log_file} and "
                        f"{Path(b.dir) / 'broker.out'}{_last_errors(b)}"
                    )
            try:
                return check_reachable(",".join(b.address for b in alive), 2.0, len(alive),
                                       identity=self._identity())
            except AuthenticationFailed:
                raise  # refused credentials do not heal by waiting
            except ClusterError:
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"brokers did not become ready within {timeout_s:.0f} s; see "
                        + ", ".join(str(b.log_file) for b in alive)
                    ) from None

    def kill(self, node_id: int | None = None) -> None:
        """SIGKILL one broker (or all): no shutdown hook runs, nothing is flushed."""
        proc.kill(self._handles(self._select(node_id)))

    def freeze(self, node_id: int) -> None:
        """SIGSTOP one broker: alive to the kernel, silent to everyone (a long GC pause, a
        hung disk). Its followers stop fetching; its heartbeats stop. ``thaw`` resumes it."""
        for p in self._handles(self._select(node_id)):
            p.send_signal(signal.SIGSTOP)  # a Popen or a checked psutil.Process, never a bare pid

    def thaw(self, node_id: int) -> None:
        """SIGCONT a frozen broker: it carries on where it stopped."""
        for p in self._handles(self._select(node_id)):
            p.send_signal(signal.SIGCONT)

    def process_states(self) -> dict[int, str]:
        """What each broker's process is doing, as the OS sees it: ``running``, ``frozen``
        (SIGSTOP) or ``down`` (killed, or not started yet)."""
        return {b.node_id: ("down" if not b.running else
                            "frozen" if proc.is_stopped(b.pid) else "running")
                for b in self.brokers}

    @contextlib.contextmanager
    def frozen(self, *node_ids: int):
        """Freeze these brokers for the block; thawed on every way out (a frozen JVM would
        otherwise outlive a failed experiment, stuck, holding its ports)."""
        try:
            for n in node_ids:
                self.freeze(n)
            yield
        finally:
            for n in node_ids:
                with contextlib.suppress(ProcessLookupError):
                    self.thaw(n)

    def restart(self, node_id: int | None = None, wait: bool = True) -> None:
        """Start killed or stopped broker(s) again on the same data dir and wait for them
        (``wait=False``: return once started; ``wait_ready`` later)."""
        java = jvm.check_java()
        classpath = jvm.classpath("kafka")
        for b in self._select(node_id):
            if b.running:
                continue
            self._spawn(java, classpath, b)
        self._save_state()
        if wait:
            with status("Waiting for the restarted broker(s)"):
                self.wait_ready()

    def stop_broker(self, node_id: int, timeout_s: float = 30.0) -> None:
        """Controlled shutdown of one broker (SIGTERM, as kafka-server-stop.sh does)."""
        self._terminate(self._select(node_id), timeout_s)

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop every broker (SIGTERM, then SIGKILL) and remove the lab's data.

        All brokers get SIGTERM at once: stopped one by one, the last ones wait in vain for
        a controller quorum that has already gone, and the data is removed anyway."""
        self._terminate(self.nodes, timeout_s)
        state = self.home / STATE_FILE
        if state.exists():
            state.unlink()
        for b in self.nodes:
            shutil.rmtree(b.dir, ignore_errors=True)
        if self.security:  # its certificates and passwords die with the lab
            self.security.remove()

    def _terminate(self, brokers: list[Broker], timeout_s: float) -> None:
        """SIGTERM the running ones together; SIGKILL whoever is still up after timeout_s."""
        proc.stop(self._handles(brokers), timeout_s)

    def _handles(self, brokers: list[Broker]) -> list:
        """What to signal for these brokers: the Popen of one this object started (its exit
        is reaped there), else its process if it is still the broker we started; never a
        bare pid, which may belong to somebody else by now."""
        found = []
        for b in brokers:
            child = self._procs.get(b.node_id)
            if child is not None and child.pid == b.pid:
                found.append(child)
            elif (p := b.process()) is not None:
                found.append(p)
        return found

    def _stop_at_exit(self) -> None:
        if os.getpid() == self.owner_pid:  # not in a forked child that inherited atexit
            self.stop(timeout_s=10)

    def _select(self, node_id: int | None) -> list[Broker]:
        return self.brokers if node_id is None else [self.broker(node_id)]

    # -- state file -----------------------------------------------------------
    def _save_state(self) -> None:
        state = {
            "brokers": [asdict(b) for b in self.brokers],
            "controller": asdict(self.controller) if self.controller else None,
            "owner_pid": None if self.detached else self.owner_pid,
            "owner_create_time": None if self.detached else proc.create_time(self.owner_pid),
            "detached": self.detached,
            "secure": self.secure,
            "started": time.time(),
        }
        # Written whole, then renamed: a reader never sees half a state file.
        tmp = self.home / f".{STATE_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.home / STATE_FILE)

    @classmethod
    def attach(cls, home: Path | None = None) -> "LocalCluster | None":
        """The running lab in ``home``, or None; a stale lab found there is cleaned up."""
        home = Path(home) if home else lab_home()
        path = home / STATE_FILE
        if not path.exists():
            return None
        state = json.loads(path.read_text())
        cluster = cls(brokers=len(state["brokers"]), home=home, detached=state["detached"],
                      secure=state.get("secure", False))
        cluster.brokers = [Broker(**b) for b in state["brokers"]]
        if state.get("controller"):
            cluster.controller = Broker(**state["controller"])
        cluster.owner_pid = state["owner_pid"]
        owner_ok = state["detached"] or proc.alive(state["owner_pid"], state.get("owner_create_time"))
        if owner_ok and all(b.process() is not None for b in cluster.nodes):
            return cluster
        cluster.stop(timeout_s=5)  # stale: kill what is left, remove state and data
        return None

    def info(self) -> dict:
        return {
            "bootstrap": self.bootstrap,
            "external": False,
            "up": all(b.running for b in self.brokers),
            "brokers": [{"node_id": b.node_id, "address": b.address, "pid": b.pid,
                         "alive": b.running, "dir": b.dir} for b in self.brokers],
            "data_dir": str(self.home),
            "detached": self.detached,
            "secure": self.secure,
            "client_properties": str(self.client_properties) if self.secure else None,
        }

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


Cluster = LocalCluster | ExternalCluster


def external_from_env_no_check() -> str:
    return settings.current().bootstrap


def external_from_env() -> ExternalCluster | None:
    bootstrap = external_from_env_no_check()
    if not bootstrap:
        return None
    cluster = ExternalCluster(bootstrap)
    cluster.wait_ready()
    return cluster


@contextlib.contextmanager
def private_cluster(prefix: str, brokers: int = 1, controller: str = "combined",
                    properties: dict[str, object] | None = None) -> Iterator[LocalCluster]:
    """A Kafka of one experiment's own, in a fresh directory under the lab home: it runs
    beside whatever cluster the other lessons use (a shared one included) and is killed and
    removed on every way out. Its data is thrown away, so no controlled shutdown (moving
    leaders would only make the learner wait, ~15 s)."""
    home = tempfile.mkdtemp(prefix=prefix, dir=lab_home())
    try:
        with LocalCluster(brokers=brokers, home=home, controller=controller,
                          properties=properties) as lab:
            try:
                yield lab
            finally:
                lab.kill()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def running() -> Cluster | None:
    """The cluster in use right now (LABKIT_BOOTSTRAP, else the running lab), or None.

    Never starts a broker: for read-only commands (`labkit inspect`, `labkit doctor`), which
    should say that nothing runs rather than start a lab to look at an empty one.
    """
    bootstrap = external_from_env_no_check()
    if bootstrap:
        return ExternalCluster(bootstrap)
    return LocalCluster.attach()


def running_or_fail() -> Cluster:
    found = running()
    if found is None:
        raise ClusterError("no lab cluster is running: start one with `labkit up` "
                           "(or set LABKIT_BOOTSTRAP=host:port to use your own cluster)")
    return found


@contextlib.contextmanager
def start_lock(home: Path | None = None):
    """Held while one process looks for the lab in ``home`` and starts it if there is none.

    Two kernels that start the lab at the same moment would otherwise both find nothing and
    both start brokers in the same directories; with the lock the second one waits, then
    attaches to the lab the first one started."""
    home = Path(home) if home else lab_home()
    with open(home / "cluster.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, also if we die
        yield


def ensure(brokers: int = 1, secure: bool = False) -> Cluster:
    """The cluster to use: LABKIT_BOOTSTRAP, else the running lab, else a new owned one.

    ``secure``: a new lab is started secure (SASL_SSL, see ``labkit.kafka.secure``). A running
    secure lab is used whatever ``secure`` says, once this process's credentials work."""
    external = external_from_env()
    if external:
        return external
    with start_lock():
        running = LocalCluster.attach()
        if running is not None:
            if len(running.brokers) != brokers:
                raise ClusterError(
                    f"a lab with {len(running.brokers)} broker(s) is running; this needs "
                    f"{brokers}. Run `labkit down` then `labkit up --brokers {brokers}`."
                )
            if secure and not running.secure:
                raise ClusterError("a plaintext lab is running; this needs a secure one. Run "
                                   "`labkit down` then `labkit up --secure`.")
            if running.secure:
                check_credentials(running)
            return running
        return LocalCluster(brokers=brokers, secure=secure).start()


def check_credentials(cluster: LocalCluster) -> None:
    """A secure lab refuses clients without its credentials: say so now, with the fix,
    rather than let the first producer time out with librdkafka's words for it."""
    if settings.current().kafka_config is None:
        raise AuthenticationFailed(f"{secure_lab.auth_message(cluster.home)}: this lab is "
                                   "secure (SASL_SSL) and LABKIT_KAFKA_CONFIG is not set")
    check_reachable(cluster.bootstrap, 10.0)
