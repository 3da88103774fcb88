"""A room's secure cluster: SASL_SSL brokers with one SCRAM user per learner and ACLs that
keep each learner inside its namespace.

``labkit up --secure`` (``labkit.kafka.secure``) is one laptop's secure lab: one ``learner`` user
allowed everything. A room shares one cluster, so here every learner gets its own user
(``learner01`` ... ``learnerNN``) whose ACLs are *prefixed* by its namespace
(``learner01.``, the rule of ``labkit.kafka.names``): it can create, read and write only its own
topics, groups and transactional ids, and a topic listing shows it nothing else. The files:

    DIR/broker/ca.pem, server.pem      the CA and the brokers' certificate (key first), PEM
    DIR/broker/node-<i>.properties     each broker's whole server.properties
    DIR/broker/node-<i>.sh             format the storage once (SCRAM users), then start it
    DIR/clients/ca.pem                 what every client trusts
    DIR/clients/learnerNN.properties   LABKIT_KAFKA_CONFIG of learner NN (librdkafka names,
                                       the same keys ``labkit up --secure`` writes)
    DIR/admin/admin.properties         the instructor's super user (ACLs, the doctor)

Listeners: INTERNAL (SASL_SSL, between brokers and for clients inside the compose network),
HOST (SASL_SSL, the address learners' laptops use) and CONTROLLER (SSL with client
certificates required: only a holder of the brokers' key, i.e. a broker, gets in; SCRAM
cannot guard a KRaft controller listener, and a plaintext one would let anyone on the
network in as a super user).

Two uses of one generator: ``compose_files`` for docker-compose (hosts ``room-1..3``), and
``RoomSecurity`` handed to a ``LocalCluster`` so the very same listener lines, format
arguments and ACLs run on this machine with the lab's jars (benchmarks/room.py --secure).
"""
from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.kafka import connection
from labkit.kafka.names import ROOM_TOPIC_PREFIX, SEPARATOR
from labkit.kafka.secure import ADMIN, MECHANISM, SCRAM_ITERATIONS, make_certificates

LEARNER_PREFIX = "learner"
COMPOSE_HOSTS = ("room-1", "room-2", "room-3")
INTERNAL_PORT, CONTROLLER_PORT, FIRST_HOST_PORT = 19092, 9093, 9292
MOUNT = "/room"  # where the compose services see DIR


def learner_user(i: int) -> str:
    """learner01 ... learner99: its SCRAM user and its LABKIT_NAMESPACE (one name for both)."""
    return f"{LEARNER_PREFIX}{i:02d}"


def scram_argument(user: str, password: str) -> list[str]:
    """``kafka-storage format --add-scram`` for one user, salted here (RFC 5802) so no
    password appears on a command line."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, SCRAM_ITERATIONS)
    return ["--add-scram",
            f"{MECHANISM}=[name={user},iterations={SCRAM_ITERATIONS},"
            f'salt="{base64.b64encode(salt).decode()}",'
            f'saltedpassword="{base64.b64encode(salted).decode()}"]']


def listener_lines(*, internal: str, internal_bind: str, host: str, host_bind: str,
                   controller_bind: str, keystore: str, truststore: str, admin_password: str,
                   broker_principal: str) -> list[str]:
    """The security lines of one broker's server.properties (the rest is the lab's own
    ``cluster.broker_properties``). ``internal``/``host`` are advertised ``host:port``;
    the ``*_bind`` values are what the broker listens on."""
    jaas = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN}" password="{admin_password}";')
    mech = MECHANISM.lower()
    return [
        f"listeners=INTERNAL://{internal_bind},HOST://{host_bind},CONTROLLER://{controller_bind}",
        f"advertised.listeners=INTERNAL://{internal},HOST://{host}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=INTERNAL",
        "listener.security.protocol.map=CONTROLLER:SSL,INTERNAL:SASL_SSL,HOST:SASL_SSL",
        f"sasl.enabled.mechanisms={MECHANISM}",
        f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
        f"listener.name.internal.{mech}.sasl.jaas.config={jaas}",
        f"listener.name.host.{mech}.sasl.jaas.config={jaas}",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={keystore}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={truststore}",
        "ssl.client.auth=none",
        # The controller listener asks for a certificate the CA signed: the brokers present
        # theirs (it is also a client certificate), nobody else has one.
        "listener.name.controller.ssl.client.auth=required",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:{ADMIN};User:{broker_principal}",
        "allow.everyone.if.no.acl.found=false",
    ]


@dataclass
class RoomFiles:
    """DIR's layout (see the module docstring); ``mount`` is where clients and brokers see
    DIR (``/room`` in compose, DIR itself on this machine)."""

    dir: Path
    mount: str

    @property
    def broker_dir(self) -> Path:
        return self.dir / "broker"

    @property
    def clients_dir(self) -> Path:
        return self.dir / "clients"

    @property
    def admin_file(self) -> Path:
        return self.dir / "admin" / "admin.properties"

    def learner_file(self, i: int) -> Path:
        return self.clients_dir / f"{learner_user(i)}.properties"

    def seen(self, path: Path) -> str:
        """``path`` (inside DIR) as the services see it."""
        return f"{self.mount.rstrip('/')}/{path.relative_to(self.dir).as_posix()}"

    def learners(self) -> list[int]:
        return sorted(int(p.stem.removeprefix(LEARNER_PREFIX))
                      for p in self.clients_dir.glob(f"{LEARNER_PREFIX}*.properties"))

    def make(self, learners: int, hosts: list[str]) -> list[str]:
        """CA, certificate (SAN: ``hosts``), passwords, client files; the format arguments."""
        if not 1 <= learners <= 99:
            raise ValueError(f"learners must be 1-99, not {learners}")
        for d in (self.broker_dir, self.clients_dir, self.admin_file.parent):
            d.mkdir(parents=True, exist_ok=True)
        ca_pem, keystore_pem = make_certificates(hosts=hosts)
        (self.broker_dir / "ca.pem").write_bytes(ca_pem)
        (self.clients_dir / "ca.pem").write_bytes(ca_pem)
        keystore = self.broker_dir / "server.pem"
        keystore.write_bytes(keystore_pem)
        # The broker's container runs as its own user (not the one writing this), so the
        # key is readable by others: keep DIR/broker on the instructor's machine only.
        keystore.chmod(0o644)
        args = []
        ca = self.seen(self.clients_dir / "ca.pem")
        users = [(ADMIN, self.admin_file)] + [(learner_user(i), self.learner_file(i))
                                              for i in range(1, learners + 1)]
        for user, path in users:
            password = secrets.token_urlsafe(18)
            connection.write_properties(path, {
                "security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM,
                "sasl.username": user, "sasl.password": password, "ssl.ca.location": ca},
                header=f"{user} on the room's cluster: SASL_SSL, {MECHANISM}.\n"
                       "On another machine: point ssl.ca.location at your copy of ca.pem.")
            args += scram_argument(user, password)
        return args

    def admin(self) -> dict[str, str]:
        return connection.read_properties(self.admin_file)

    def broker_principal(self) -> str:
        """The brokers' certificate subject, as Kafka names an SSL client (RFC 2253)."""
        from cryptography import x509

        pem = (self.broker_dir / "server.pem").read_bytes()
        start = pem.index(b"-----BEGIN CERTIFICATE-----")  # the key comes first
        return x509.load_pem_x509_certificate(pem[start:]).subject.rfc4514_string()

    def lines(self, internal: str, internal_bind: str, host: str, host_bind: str,
              controller_bind: str) -> list[str]:
        return listener_lines(internal=internal, internal_bind=internal_bind, host=host,
                              host_bind=host_bind, controller_bind=controller_bind,
                              keystore=self.seen(self.broker_dir / "server.pem"),
                              truststore=self.seen(self.broker_dir / "ca.pem"),
                              admin_password=self.admin()["sasl.password"],
                              broker_principal=self.broker_principal())


def grant(bootstrap: str, files: RoomFiles, timeout_s: float = 120.0) -> int:
    """Each learner's prefixed ACLs, created as the admin: all on the topics, groups and
    transactional ids that start with its namespace, idempotent writes, and writing (not
    reading) the room boards' topics; nothing on the cluster's other names (so listings
    show it only its own). Waits up to ``timeout_s`` for
    the cluster (compose starts this next to the brokers). Returns the bindings created."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType,
                                       AdminClient, ResourcePatternType, ResourceType)

    from labkit.kafka.reach import check_reachable
    from labkit.kafka.clientlog import client_config

    admin_props = files.admin()
    check_reachable(bootstrap, timeout_s=timeout_s, identity=admin_props)
    bindings = []
    for i in files.learners():
        user = learner_user(i)
        principal = f"User:{user}"
        for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID):
            bindings.append(AclBinding(kind, user + SEPARATOR, ResourcePatternType.PREFIXED,
                                       principal, "*", AclOperation.ALL, AclPermissionType.ALLOW))
        bindings.append(AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                                   principal, "*", AclOperation.IDEMPOTENT_WRITE,
                                   AclPermissionType.ALLOW))
        # the room's board (labkit.room.board): every learner writes its results, only the
        # instructor (the admin) reads them
        for operation in (AclOperation.WRITE, AclOperation.DESCRIBE):
            bindings.append(AclBinding(ResourceType.TOPIC, ROOM_TOPIC_PREFIX,
                                       ResourcePatternType.PREFIXED, principal, "*", operation,
                                       AclPermissionType.ALLOW))
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap, **admin_props}))
    deadline = time.monotonic() + timeout_s
    for _binding, future in admin.create_acls(bindings, request_timeout=60).items():
        future.result(timeout=max(1.0, deadline - time.monotonic()))  # raises if refused
    return len(bindings)


# --------------------------------------------------------------------------- compose


def compose_files(dir: Path, learners: int, room_host: str = "127.0.0.1",
                  extra_hosts: tuple[str, ...] = (), force: bool = False) -> RoomFiles | None:
    """The files of docker-compose's ``secure`` profile, for hosts ``room-1..3`` (None when
    DIR is made already and not ``force``: a restarted room keeps its passwords, which its
    brokers' storage was formatted with)."""
    from labkit.kafka.broker import Broker
    from labkit.kafka.brokerconfig import broker_properties, new_cluster_id

    files = RoomFiles(Path(dir), MOUNT)
    if (files.broker_dir / "node-1.sh").exists() and not force:
        return None
    hosts = list(dict.fromkeys([*COMPOSE_HOSTS, "localhost", "127.0.0.1", room_host,
                                *extra_hosts]))
    scram = files.make(learners, hosts)
    voters = ",".join(f"{n}@{h}:{CONTROLLER_PORT}" for n, h in enumerate(COMPOSE_HOSTS, 1))
    cluster_id = new_cluster_id()
    for n, name in enumerate(COMPOSE_HOSTS, 1):
        host_port = FIRST_HOST_PORT + n - 1
        lines = files.lines(internal=f"{name}:{INTERNAL_PORT}", internal_bind=f":{INTERNAL_PORT}",
                            host=f"{room_host}:{host_port}", host_bind=f":{host_port}",
                            controller_bind=f":{CONTROLLER_PORT}")
        broker = Broker(node_id=n, port=INTERNAL_PORT, controller_port=CONTROLLER_PORT,
                        dir="/var/lib/kafka")  # log.dirs=/var/lib/kafka/data
        props = files.broker_dir / f"node-{n}.properties"
        props.write_text(broker_properties(broker, voters, len(COMPOSE_HOSTS), lines))
        props.chmod(0o644)  # read by the broker container's user; holds the admin password
        seen = files.seen(props)
        script = files.broker_dir / f"node-{n}.sh"
        script.write_text("\n".join([
            "#!/bin/bash",
            f"# room-{n}: format the storage once (the SCRAM users go into the metadata log),",
            "# then run the broker with the generated server.properties (python -m labkit.room.secure_cluster files).",
            "set -e",
            "if [ ! -f /var/lib/kafka/data/meta.properties ]; then",
            f"  /opt/kafka/bin/kafka-storage.sh format -t {cluster_id} -c {seen} "
            + " ".join(shlex.quote(a) for a in scram),
            "fi",
            f"exec /opt/kafka/bin/kafka-server-start.sh {seen}",
            ""]))
        script.chmod(0o755)
    _give_to_owner_of(files.dir)
    return files


def _give_to_owner_of(root: Path) -> None:
    """Made by root in a container into a directory the instructor made: hand every file to
    that directory's owner, so the instructor can copy the learners' files out of it."""
    st = root.stat()
    if os.geteuid() != 0 or st.st_uid == 0:
        return
    for path in [root, *root.rglob("*")]:
        os.chown(path, st.st_uid, st.st_gid)


# --------------------------------------------------------------------------- this machine


@dataclass
class RoomSecurity:
    """``labkit.kafka.secure.SecureLab``'s part in ``LocalCluster.start`` (prepare, listener lines,
    format arguments, ACLs, the lab's identity), played by the room's generator: a
    ``LocalCluster(brokers=3, secure=True)`` whose ``security`` is this runs the room's
    brokers on 127.0.0.1 with the lab's jars."""

    dir: Path
    learners: int
    _scram: list[str] = field(default_factory=list, repr=False)

    @property
    def files(self) -> RoomFiles:
        return RoomFiles(Path(self.dir), str(self.dir))

    @property
    def client_file(self) -> Path:
        return self.files.learner_file(1)

    def prepare(self) -> "RoomSecurity":
        self._scram = self.files.make(self.learners, ["localhost", "127.0.0.1"])
        return self

    def listener_properties(self, port: int, controller_port: int) -> list[str]:
        from labkit.kafka.ports import free_port

        host_port = free_port()  # the HOST listener: a second SASL_SSL port, as in compose
        return self.files.lines(internal=f"127.0.0.1:{port}", internal_bind=f"127.0.0.1:{port}",
                                host=f"127.0.0.1:{host_port}", host_bind=f"127.0.0.1:{host_port}",
                                controller_bind=f"127.0.0.1:{controller_port}")

    def format_arguments(self) -> list[str]:
        return self._scram

    def admin_config(self) -> dict[str, str]:
        return self.files.admin()

    def grant_learner(self, bootstrap: str) -> None:
        grant(bootstrap, self.files)

    def remove(self) -> None:
        pass  # the caller's directory: removed with it


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit.room.secure_cluster files DIR ...`` and ``... grant DIR --bootstrap ...``: what
    docker-compose's ``secure`` profile runs (its room-files and room-acls services)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m labkit.room.secure_cluster",
                                     description="A room's SASL_SSL cluster: files and ACLs.")
    sub = parser.add_subparsers(dest="command", required=True)
    files = sub.add_parser("files", help="make DIR's certificates, users and broker files "
                                         "(kept if DIR has them already)")
    files.add_argument("dir", type=Path)
    files.add_argument("--learners", type=int, default=30, help="users learner01..NN (1-99)")
    files.add_argument("--room-host", default="127.0.0.1",
                       help="the address learners' machines reach the brokers at (advertised, "
                            "and in the certificate)")
    files.add_argument("--force", action="store_true", help="make new files even if DIR has some")
    acls = sub.add_parser("grant", help="create each learner's prefixed ACLs as the admin")
    acls.add_argument("dir", type=Path)
    acls.add_argument("--bootstrap", required=True)
    acls.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args(argv)
    if args.command == "files":
        made = compose_files(args.dir, args.learners, args.room_host, force=args.force)
        print(f"{args.dir}: kept (made before; --force makes new ones)" if made is None else
              f"{args.dir}: CA, broker certificate, admin + {args.learners} learner users; "
              f"learners' LABKIT_KAFKA_CONFIG files in {args.dir / 'clients'}", flush=True)
        return 0
    n = grant(args.bootstrap, RoomFiles(args.dir, MOUNT), timeout_s=args.timeout)
    print(f"{n} ACL bindings: each learner NN may use the names starting with "
          f"{LEARNER_PREFIX}NN{SEPARATOR} only", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
