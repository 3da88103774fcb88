"""The secure lab (``labkit up --secure``): SASL_SSL with SCRAM-SHA-512, TLS and ACLs on.

What a managed Kafka or a room's cluster asks of a client, on the laptop, with the real broker:

* a CA and a server certificate made here (SAN ``127.0.0.1`` and ``localhost``), which the
  broker reads as PEM files (``ssl.keystore.type=PEM``), the clients trust through the CA;
* two SCRAM-SHA-512 users written into the metadata log when the storage is formatted
  (``kafka-storage format --add-scram``), so they exist before the broker first answers:
  ``admin`` (a super user: the brokers talk to each other as it, the lab creates the ACLs
  as it) and ``learner`` (what notebooks and the CLI use);
* ACLs on (``StandardAuthorizer``, nothing allowed without an ACL): the learner gets what
  the lessons need (topics, groups, transactional ids, idempotent writes, describing the
  cluster) and nothing else (no ACL changes, no broker configs);
* ``<LABKIT_HOME>/client.properties`` in librdkafka's names for the learner: the file
  ``LABKIT_KAFKA_CONFIG`` points at (see ``labkit.kafka.connection``).

The controller listener stays PLAINTEXT on 127.0.0.1, for the brokers: a broker registering
with its controller arrives there as ``User:ANONYMOUS``, hence a super user. It serves no
produce or fetch, but a process on this machine could send it controller requests (KIP-919
admin calls) as that super user: the secure lab rehearses what a client of an authenticated
cluster must do, it is not a hardened broker.
``labkit.kafka.localcluster`` only asks this module for the listener properties, the format arguments
and the ACLs; the lab's state file records that the lab is secure.
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit.kafka import connection

MECHANISM = "SCRAM-SHA-512"
ADMIN, LEARNER = "admin", "learner"
CLIENT_PROPERTIES = "client.properties"
SCRAM_ITERATIONS = 8192
AUTH_ADVICE = "(labkit up --secure wrote it)"


@dataclass(frozen=True)
class SecureLab:
    """The secure lab's files in one lab home: certificates, users, the client config."""

    home: Path

    @property
    def dir(self) -> Path:
        return self.home / "secure"

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def keystore_file(self) -> Path:  # the server's private key, then its certificate chain
        return self.dir / "server.pem"

    @property
    def admin_file(self) -> Path:
        return self.dir / "admin.properties"

    @property
    def client_file(self) -> Path:
        return self.home / CLIENT_PROPERTIES

    # -- made once per start -------------------------------------------------------
    def prepare(self) -> "SecureLab":
        """New CA, server certificate and passwords; the admin's and learner's configs."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.dir.chmod(0o700)
        ca_pem, keystore_pem = make_certificates()
        self.ca_file.write_bytes(ca_pem)
        self.keystore_file.write_bytes(keystore_pem)
        self.keystore_file.chmod(0o600)
        for user, path in ((ADMIN, self.admin_file), (LEARNER, self.client_file)):
            connection.write_properties(path, self._client_props(user, secrets.token_urlsafe(18)),
                                        header=f"the lab's {user} user: SASL_SSL, SCRAM-SHA-512")
        return self

    def _client_props(self, user: str, password: str) -> dict[str, str]:
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM,
                "sasl.username": user, "sasl.password": password,
                "ssl.ca.location": str(self.ca_file)}

    def password(self, user: str) -> str:
        path = self.admin_file if user == ADMIN else self.client_file
        return connection.read_properties(path)["sasl.password"]

    def admin_config(self) -> dict[str, str]:
        """The lab's own identity (a super user): readiness checks, ACLs."""
        return connection.read_properties(self.admin_file)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.client_file.unlink(missing_ok=True)

    # -- what the broker is told -----------------------------------------------------
    def listener_properties(self, port: int, controller_port: int) -> list[str]:
        """The listener lines of a broker's server.properties (everything else is unchanged)."""
        jaas = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{ADMIN}" password="{self.password(ADMIN)}";')
        return [
            f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=SASL_SSL://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_SSL",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
            f"sasl.enabled.mechanisms={MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config={jaas}",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={self.keystore_file}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={self.ca_file}",
            "ssl.client.auth=none",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            f"super.users=User:{ADMIN};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found=false",
        ]

    def format_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments that create both users in the metadata log.

        Salted here (RFC 5802: PBKDF2-HMAC-SHA512) so no password appears on a command line
        another user of the machine could read in ``ps``."""
        args = []
        for user in (ADMIN, LEARNER):
            salt = secrets.token_bytes(16)
            salted = hashlib.pbkdf2_hmac("sha512", self.password(user).encode(), salt,
                                         SCRAM_ITERATIONS)
            args += ["--add-scram",
                     f"{MECHANISM}=[name={user},iterations={SCRAM_ITERATIONS},"
                     f'salt="{base64.b64encode(salt).decode()}",'
                     f'saltedpassword="{base64.b64encode(salted).decode()}"]']
        return args

    def grant_learner(self, bootstrap: str) -> None:
        """The learner's ACLs, created as the admin: what the lessons need, nothing more."""
        from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType,
                                           AdminClient, ResourcePatternType, ResourceType)

        from labkit.kafka.clientlog import client_config

        principal = f"User:{LEARNER}"

        def allow(kind: ResourceType, name: str, op: AclOperation) -> AclBinding:
            return AclBinding(kind, name, ResourcePatternType.LITERAL, principal, "*", op,
                              AclPermissionType.ALLOW)

        bindings = [
            allow(ResourceType.TOPIC, "*", AclOperation.ALL),            # create, write, read, delete
            allow(ResourceType.GROUP, "*", AclOperation.ALL),            # consumer and share groups
            allow(ResourceType.TRANSACTIONAL_ID, "*", AclOperation.ALL),
            allow(ResourceType.BROKER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE),
            allow(ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE),
            allow(ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE_CONFIGS),
        ]
        admin = AdminClient(client_config({"bootstrap.servers": bootstrap, **self.admin_config()}))
        for binding, future in admin.create_acls(bindings, request_timeout=30).items():
            future.result(timeout=60)  # raises if the broker refused one


def make_certificates(days: int = 365,
                      hosts: Sequence[str] = ("localhost", "127.0.0.1")) -> tuple[bytes, bytes]:
    """A CA and a server certificate it signed, for ``hosts`` (IP addresses and DNS names).

    Returns the CA certificate (PEM) and the server's keystore: its unencrypted PKCS#8 key
    followed by its certificate and the CA's (the broker's PEM keystore format)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "labkit"),
                          x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("labkit lab CA")).issuer_name(name("labkit lab CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    server = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
              .public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(start).not_valid_after(end)
              .add_extension(x509.SubjectAlternativeName([_san(x509, h) for h in hosts]),
                             critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                    ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    ca_pem = ca.public_bytes(pem)
    keystore = (key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
                + server.public_bytes(pem) + ca_pem)
    return ca_pem, keystore


def _san(x509, host: str):
    """An IP address as an IP entry (what TLS clients match an IP against), else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def operator_properties(home: Path) -> dict[str, str] | None:
    """The admin's connection settings when ``home`` holds a running secure lab, else None.

    For the one operator's view a lesson shows, a share group's stored state: Kafka serves
    ReadShareGroupState to ClusterAction only (an inter-broker API), which a learner, here as
    on a room's cluster, is not granted. Only the lab's own local broker has an admin to
    lend; on any other cluster that view needs the operator's credentials."""
    lab = SecureLab(home)
    return lab.admin_config() if lab.admin_file.is_file() else None


def auth_message(home: Path) -> str:
    """What a client without (the right) credentials is told: the variable and the file."""
    path = SecureLab(home).client_file
    where = str(path) if path.exists() else "<path to your client.properties>"
    return f"authentication failed: set LABKIT_KAFKA_CONFIG={where} {AUTH_ADVICE}"


# librdkafka also reports a SASL handshake whose connection dropped or timed out as
# _AUTHENTICATION ("SaslAuthenticateRequest failed: Local: Broker transport failure"): the
# next connection may well succeed, so that is a wait, not refused credentials.
TRANSIENT_CAUSES = ("local: broker transport failure", "local: timed out")


def looks_like_auth_failure(error_text: str) -> bool:
    """librdkafka's words for: wrong or missing credentials, or plaintext to a TLS port (not
    a connection that broke during the handshake)."""
    text = error_text.lower()
    if any(cause in text for cause in TRANSIENT_CAUSES):
        return False
    return any(words in text for words in (
        "authentication failed", "sasl authentication error", "_authentication",
        "incorrect security.protocol", "connecting to a ssl listener",
        "ssl handshake failed", "certificate verify failed", "invalid credentials"))

