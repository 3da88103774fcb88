"""The lab's own Kafka: 1 or 3 real Apache Kafka brokers (KRaft) as child processes.

    with LocalCluster(brokers=1) as cluster:      # start, wait ready, stop on exit
        cluster.bootstrap                         # '127.0.0.1:41234'
        cluster.kill()                            # SIGKILL: nothing flushed, nothing closed
        cluster.restart()                         # same data dir: acknowledged data is back

No orphans: an owned broker gets SIGKILL from the kernel when its owner dies
(PR_SET_PDEATHSIG), and ``atexit`` stops it cleanly on a normal exit. A detached lab
(``labkit up``) outlives the CLI; its pids, each with its process's start time (a recycled
pid is not our broker), live in ``$LABKIT_HOME/cluster.json`` and a lab whose brokers or
owner died is detected there and cleaned up by the next start (``LocalCluster.attach``).
One broker's process is ``labkit.kafka.broker``'s, its settings ``labkit.kafka.brokerconfig``'s.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from labkit import proc

from labkit.kafka import jvm
from labkit.kafka import secure as secure_lab
from labkit.kafka.broker import Broker, format_storage, last_errors, spawn
from labkit.kafka.brokerconfig import (CONTROLLER_NODE_ID, LOG4J2, broker_properties,
                                       controller_properties, new_cluster_id,
                                       partitionable_controller, partitionable_listeners)
from labkit.kafka.ports import PortInUseError, free_port, port_is_free
from labkit.kafka.reach import (AuthenticationFailed, ClusterError, accepts_connections,
                                check_reachable)
from labkit.paths import lab_home, load_state, save_state
from labkit.progress import status

READY_TIMEOUT_S = 90.0
STATE_FILE = "cluster.json"


class LocalCluster:
    """1 or 3 real Kafka brokers in KRaft combined mode, each a child JVM."""

    external = False

    def __init__(self, brokers: int = 1, home: Path | None = None, port: int | None = None,
                 detached: bool = False, secure: bool = False, controller: str = "combined",
                 properties: dict[str, object] | None = None, network: Any = None):
        if brokers not in (1, 3):
            raise ValueError(f"brokers must be 1 or 3, not {brokers}")
        if controller not in ("combined", "dedicated"):
            raise ValueError(f"controller must be 'combined' or 'dedicated', not {controller!r}")
        if controller == "dedicated" and (brokers != 3 or secure):
            raise ValueError("a dedicated controller is for the plaintext 3-broker failure lab")
        if network is not None and controller != "dedicated":
            raise ValueError("a network to cut is for the failure lab (controller='dedicated')")
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
        # A partitionable failure lab: each broker's link to the controller and the link its
        # followers fetch through go through ``network`` (labkit.faults.partition.Network,
        # given from above: this layer only names the links), so they can be cut.
        self.network = network
        self.links: dict[str, tuple[int, int]] = {}  # name -> (forwarder's port, real port)
        self._replication_ports: dict[int, int] = {}

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
                    own_voters = voters
                    if self.network is not None and b is not self.controller:
                        listeners = partitionable_listeners(
                            b, self._replication_ports[b.node_id],
                            self.links[f"replication-{b.node_id}"][0])
                        # the controller as this broker reaches it: through its own link
                        own_voters = (f"{CONTROLLER_NODE_ID}@127.0.0.1:"
                                      f"{self.links[f'controller-{b.node_id}'][0]}")
                    (d / "server.properties").write_text(
                        controller_properties(b, voters, self._controller_listeners())
                        if b is self.controller else
                        broker_properties(b, own_voters, len(self.brokers), listeners,
                                          dedicated_controller=self.controller is not None,
                                          extra=self.properties))
                    if self.security:  # its JAAS line holds the admin's password
                        (d / "server.properties").chmod(0o600)
                    (d / "log4j2.properties").write_text(LOG4J2.format(log=b.log_file))
                    update(f"Formatting storage of broker {b.node_id}")
                    format_storage(java, classpath, b, cluster_id,
                                   self.security.format_arguments() if self.security else [])
                if self.network is not None:
                    self.network.route(self.links)
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
        if self.network is not None:
            for b in self.brokers:  # the controller listens for each broker apart
                self._replication_ports[b.node_id] = untaken()
                self.links[f"replication-{b.node_id}"] = (untaken(),
                                                           self._replication_ports[b.node_id])
                self.links[f"controller-{b.node_id}"] = (
                    untaken(), self.controller.port if b is self.brokers[0] else untaken())

    def _controller_listeners(self) -> list[str] | None:
        if self.network is None:
            return None
        return partitionable_controller({b.node_id: self.links[f"controller-{b.node_id}"]
                                         for b in self.brokers})

    def _spawn(self, java: str, classpath: str, b: Broker) -> None:
        # an owned broker dies with its owner; a detached lab's outlives the CLI
        self._procs[b.node_id] = spawn(java, classpath, b, owned=not self.detached)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict[int, str]:
        alive = [b for b in self.brokers if b.running]
        deadline = time.monotonic() + timeout_s
        while True:
            for b in alive:
                if not b.running:
                    raise ClusterError(
                        f"broker {b.node_id} exited while starting; see {b.log_file} and "
                        f"{Path(b.dir) / 'broker.out'}{last_errors(b)}"
                    )
            try:
                brokers = check_reachable(",".join(b.address for b in alive), 2.0, len(alive),
                                          identity=self._identity())
                # the metadata lists a broker (registered with the controller) before its own
                # listener takes connections: a client sent to it then was refused (a fresh
                # clone's tests/test_cluster.py), so ready means each one also accepts
                refusing = [b.address for b in alive if not accepts_connections(b.address)]
                if not refusing:
                    return brokers
                raise ClusterError(f"listed in the metadata, not accepting yet: {refusing}")
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

    def isolate(self, node_id: int) -> None:
        """Partition broker ``node_id`` from the others (a partitionable lab only): its link
        to the controller and the link its followers fetch through are cut; clients still
        reach it directly. ``heal`` joins it again."""
        if self.network is None:
            raise ClusterError("this lab's links cannot be cut: start it with network=")
        self.broker(node_id)
        self.network.cut(f"controller-{node_id}", f"replication-{node_id}")

    def heal(self) -> None:
        """Every cut link forwards again."""
        if self.network is not None:
            self.network.heal()

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
        if self.network is not None:
            self.network.close()
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
        save_state(self.home, STATE_FILE, state)

    @classmethod
    def attach(cls, home: Path | None = None) -> "LocalCluster | None":
        """The running lab in ``home``, or None; a stale lab found there is cleaned up."""
        home, state = load_state(home, STATE_FILE)
        if state is None:
            return None
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


@contextlib.contextmanager
def private_cluster(prefix: str, brokers: int = 1, controller: str = "combined",
                    properties: dict[str, object] | None = None,
                    network: Any = None) -> Iterator[LocalCluster]:
    """A Kafka of one experiment's own, in a fresh directory under the lab home: it runs
    beside whatever cluster the other lessons use (a shared one included) and is killed and
    removed on every way out. Its data is thrown away, so no controlled shutdown (moving
    leaders would only make the learner wait, ~15 s)."""
    home = tempfile.mkdtemp(prefix=prefix, dir=lab_home())
    try:
        with LocalCluster(brokers=brokers, home=home, controller=controller,
                          properties=properties, network=network) as lab:
            try:
                yield lab
            finally:
                lab.kill()
    finally:
        shutil.rmtree(home, ignore_errors=True)
