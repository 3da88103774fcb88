"""One real Kafka broker for the whole test run: tests and notebooks (nbval) share it.

It is started before collection-time work (pytest_sessionstart) so notebook kernels, which
are separate processes, find it too: they inherit LABKIT_HOME and ``labkit.cluster.ensure()``
attaches to it. With LABKIT_BOOTSTRAP set, everything runs against that external cluster.
Tests that kill or restart brokers start their own clusters and leave this one alone.
"""
from __future__ import annotations

import os
import tempfile
import uuid

import pytest

from labkit import cluster as lab

_shared: dict[str, object] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    external = lab.external_from_env()
    if external is not None:
        _shared["cluster"] = external
        return
    home = tempfile.mkdtemp(prefix="labkit-test-")
    os.environ["LABKIT_HOME"] = home  # notebook kernels attach to the same broker
    _shared["cluster"] = lab.LocalCluster(brokers=1, home=home).start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shared = _shared.pop("cluster", None)
    if shared is not None:
        shared.stop()


@pytest.fixture(scope="session")
def cluster() -> lab.Cluster:
    return _shared["cluster"]


@pytest.fixture(scope="session")
def bootstrap(cluster: lab.Cluster) -> str:
    return cluster.bootstrap


@pytest.fixture
def topic_name() -> str:
    """A fresh topic name per test, so tests never see each other's records."""
    return f"t-{uuid.uuid4().hex[:10]}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """nbval compares what a notebook *shows* (audits, verdicts, tables), not stderr: that
    stream carries progress spinners and librdkafka's log lines, whose timing varies."""
    for item in items:
        parent = getattr(item, "parent", None)
        skip = getattr(parent, "skip_compare", None)
        if skip is not None and "stderr" not in skip:
            parent.skip_compare = (*skip, "stderr")
