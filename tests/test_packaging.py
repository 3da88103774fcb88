"""docker-compose.yml, environment.yml, pyproject.toml and jvm/pom.xml agree on versions and ports.

Neither Docker nor conda runs on the CI machine, so these files are checked by parsing them.
"""
from __future__ import annotations

import base64
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from labkit.kafka import jvm

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def pins(pyproject) -> dict[str, str]:
    deps = pyproject["project"]["dependencies"] + pyproject["project"]["optional-dependencies"]["dev"]
    return dict(d.split("==") for d in deps)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def conda() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def test_every_python_dependency_is_pinned(pyproject):
    deps = pyproject["project"]["dependencies"] + pyproject["project"]["optional-dependencies"]["dev"]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.]+", d) for d in deps), deps


def test_spark_connector_matches_pyspark(pins):
    versions = jvm.pinned_versions()
    assert versions["spark.version"] == pins["pyspark"]
    assert versions["scala.binary.version"] == "2.13"  # pyspark 4 is built for Scala 2.13


def test_installed_pandas_is_one_pyspark_supports(pins):
    """pyspark checks pandas itself (too old: an error; 3.x: "does not yet fully support"):
    the pinned pandas, as installed, passes that check without a warning."""
    import warnings

    import pandas
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    assert pandas.__version__ == pins["pandas"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        require_minimum_pandas_version()


def test_compose_kafka_image_is_the_pinned_broker(compose):
    kafka_version = jvm.pinned_versions()["kafka.version"]
    images = {name: svc["image"] for name, svc in compose["services"].items()
              if name.startswith("kafka")}
    assert set(images) == {"kafka", "kafka-1", "kafka-2", "kafka-3"}
    assert set(images.values()) == {f"apache/kafka:{kafka_version}"}


def test_compose_publishes_only_on_loopback(compose):
    for name, svc in compose["services"].items():
        for mapping in svc.get("ports", []):
            # The secure room's brokers (SASL_SSL, ACLs) may be opened to a room's network
            # with ROOM_BIND; unset, they too bind to loopback.
            allowed = (("127.0.0.1:", "${ROOM_BIND:-127.0.0.1}:") if name.startswith("room-")
                       else ("127.0.0.1:",))
            assert mapping.startswith(allowed), f"{name} publishes {mapping} beyond loopback"


def test_compose_listeners_and_ports_agree(compose):
    for name, svc in compose["services"].items():
        if not name.startswith("kafka"):
            continue
        env = svc["environment"]
        advertised = dict(part.split("://") for part in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
        listeners = dict(part.split("://") for part in env["KAFKA_LISTENERS"].split(","))
        host_port = advertised["HOST"].rsplit(":", 1)[1]
        assert listeners["HOST"] == f":{host_port}"
        assert svc["ports"] == [f"127.0.0.1:{host_port}:{host_port}"]
        assert advertised["INTERNAL"] == f"{svc['hostname']}:19092"
        assert env["KAFKA_NODE_ID"] in env["KAFKA_CONTROLLER_QUORUM_VOTERS"]
        if "CLUSTER_ID" in env:  # must be a base64url UUID, or the image's format step fails
            assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16


def test_jupyter_service_points_labkit_at_compose_kafka(compose):
    env = compose["services"]["jupyter"]["environment"]
    assert env["LABKIT_BOOTSTRAP"].endswith("kafka:19092}")
    assert compose["services"]["jupyter"]["depends_on"] == ["kafka", "postgres"]
    pg = compose["services"]["postgres"]["environment"]
    assert env["LABKIT_PG_DSN"] == (f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}"
                                    f"@postgres:5432/{pg['POSTGRES_DB']}")


def test_jupyter_image_installs_labkit_with_its_pins():
    dockerfile = (ROOT / "docker" / "jupyter.Dockerfile").read_text()
    assert "openjdk-17" in dockerfile and "maven" in dockerfile
    assert "pip install --no-cache-dir -e '.[dev]'" in dockerfile and "labkit setup" in dockerfile


def test_conda_environment_matches_pip_setup(conda, pins, pyproject):
    deps = conda["dependencies"]
    assert "python=" + pyproject["project"]["requires-python"].removeprefix(">=") in deps
    assert "openjdk=17" in deps and "maven" in deps
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict))
    assert dict(d.split("==") for d in pip_section) == pins


def test_delta_jars_match_the_python_delta_spark(pins):
    """The PyPI delta-spark (its Python API) and the jars the pom fetches are one release,
    built for the pinned Spark: delta-spark 4.4.x supports pyspark 4.2.x."""
    versions = jvm.pinned_versions()
    assert versions["delta.version"] == pins["delta-spark"]
    assert pins["delta-spark"].startswith("4.4.") and pins["pyspark"].startswith("4.2.")
    pom = (ROOT / "jvm" / "pom.xml").read_text()
    spark_profile = pom.split("<id>spark</id>", 1)[1].split("</profile>", 1)[0]
    assert "<artifactId>delta-spark_${scala.binary.version}</artifactId>" in spark_profile
    assert "<artifactId>delta-storage</artifactId>" in spark_profile
