"""`labkit doctor`, the workshop preflight, and read-only commands that never start a broker.

Run as a learner would: the `labkit` command in a child process, judged by its exit code,
its JSON and what the cluster shows afterwards.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from confluent_kafka.admin import AdminClient

from labkit.kafka.clientlog import client_config

CHECKS_WITH_A_CLUSTER = ["python", "java", "maven", "jars", "memory", "disk", "port", "cluster",
                         "credentials", "reachable", "produce/consume", "transactions",
                         "postgres binaries", "postgres"]


def _labkit(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def _env(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LABKIT_BOOTSTRAP", "LABKIT_JAVA")}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_doctor_passes_on_a_working_lab_and_cleans_up_its_round_trip_topics(bootstrap: str) -> None:
    out = _labkit("doctor", "--json", env=_env(LABKIT_BOOTSTRAP=bootstrap))
    report = json.loads(out.stdout)
    failed = [c for c in report["checks"] if not c["ok"]]
    assert out.returncode == 0 and report["ok"] and not failed, failed or out.stderr[-2000:]
    assert [c["name"] for c in report["checks"]] == [*CHECKS_WITH_A_CLUSTER, "spark"]
    topics = AdminClient(client_config({"bootstrap.servers": bootstrap})).list_topics(timeout=10).topics
    assert not [t for t in topics if "labkit-doctor-" in t]  # also in a learner's namespace


def test_doctor_checks_the_lab_postgres_it_finds_running(bootstrap: str, pg_dsn: str) -> None:
    out = _labkit("doctor", "--json", "--no-spark", env=_env(LABKIT_BOOTSTRAP=bootstrap))
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["postgres binaries"]["ok"], checks["postgres binaries"]
    assert checks["postgres binaries"]["detail"].startswith("PostgreSQL 18.")
    assert checks["postgres"]["ok"] and checks["postgres"]["detail"].endswith(
        "wal_level=logical"), checks["postgres"]
    if not os.environ.get("LABKIT_PG_DSN"):  # the server conftest.py started, found by its state
        port = pg_dsn.rsplit(":", 1)[1].split("/")[0]
        assert f"the lab's server on 127.0.0.1:{port} answers" in checks["postgres"]["detail"]


def test_doctor_names_an_unreachable_postgres_and_its_fix(tmp_path: Path) -> None:
    dead = f"postgresql://lab:lab@127.0.0.1:{_free_port()}/lab"
    out = _labkit("doctor", "--no-spark", env=_env(LABKIT_HOME=str(tmp_path), LABKIT_PG_DSN=dead))
    assert out.returncode == 1
    line = next(line for line in out.stdout.splitlines() if line.startswith("FAIL postgres:"))
    assert "127.0.0.1" in line and "refused" in line.lower(), out.stdout
    assert "fix: check LABKIT_PG_DSN" in out.stdout


def test_doctor_names_missing_java_and_its_fix(tmp_path: Path) -> None:
    # A PATH with Maven but no java, and no JAVA_HOME: what a machine without a JDK looks like.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mvn").symlink_to(shutil.which("mvn"))
    out = _labkit("doctor", "--json", "--no-spark",
                  env=_env(PATH=str(bin_dir), JAVA_HOME=None, LABKIT_HOME=str(tmp_path / "home")))
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert out.returncode == 1
    assert not checks["java"]["ok"] and "Java was not found" in checks["java"]["detail"]
    assert "openjdk-17" in checks["java"]["fix"]
    assert checks["maven"]["ok"] and checks["python"]["ok"]
    # nothing runs in this fresh home, and the doctor did not start anything
    assert not checks["cluster"]["ok"] and "labkit up" in checks["cluster"]["fix"]
    home = tmp_path / "home"
    assert not home.exists() or list(home.iterdir()) == []  # no state file, no broker dir


def test_doctor_names_an_unreachable_cluster(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{_free_port()}"
    out = _labkit("doctor", "--no-spark", env=_env(LABKIT_BOOTSTRAP=dead))
    assert out.returncode == 1
    assert f"FAIL reachable: Kafka at {dead} is not reachable" in out.stdout
    assert "fix: check the address" in out.stdout
    assert "produce/consume" not in out.stdout  # no round trip against a cluster that is not there


def test_inspect_with_nothing_running_says_so_and_starts_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    out = _labkit("inspect", "payments", env=_env(LABKIT_HOME=str(home)), timeout=60)
    assert out.returncode == 2
    assert "no lab cluster is running: start one with `labkit up`" in out.stderr
    assert list(home.iterdir()) == []  # no broker directory, no state file
