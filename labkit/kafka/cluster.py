"""Which Kafka the lab uses: an external cluster (``LABKIT_BOOTSTRAP``: docker-compose, a
workshop server) or the lab's own (``labkit.kafka.localcluster``).

``ensure()`` is what notebooks call: the cluster named by ``LABKIT_BOOTSTRAP`` if set, else
the lab cluster ``labkit up`` started, else a new one owned by this Python process.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from labkit import settings

from labkit.kafka import secure as secure_lab
from labkit.kafka.localcluster import LocalCluster
from labkit.kafka.reach import AuthenticationFailed, ClusterError, check_reachable
from labkit.paths import home_lock


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


def start_lock(home: Path | None = None) -> contextlib.AbstractContextManager[None]:
    """Held while one process looks for the lab in ``home`` and starts it if there is none
    (labkit.paths.home_lock)."""
    return home_lock("cluster.lock", home)


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
