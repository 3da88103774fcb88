"""Bad input and missing tools get a clear message that says what to do."""
from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.kafka import jvm
from labkit.kafka.localcluster import LocalCluster
from labkit.kafka.ports import PortInUseError
from labkit.kafka.reach import ClusterError, check_reachable
from labkit.proc import die_with_owner, pid_alive
from labkit.paths import LabkitSetupError
from labkit.storage.postgres import LabPostgres

LABKIT = [sys.executable, "-m", "labkit.cli"]


def fake_java(tmp_path: Path, version_line: str) -> str:
    """A script standing in for *an old JDK's* `java -version` (not for Kafka)."""
    script = tmp_path / "java"
    script.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.parametrize("line, major", [
    ('openjdk version "17.0.15" 2025-04-15', 17),
    ('java version "1.8.0_292"', 8),
    ('openjdk version "21" 2023-09-19', 21),
    ('openjdk version "11.0.2" 2019-01-15', 11),
])
def test_java_version_is_parsed(line, major):
    assert jvm.parse_java_major(line) == major


def test_old_java_is_refused_with_install_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_JAVA", fake_java(tmp_path, 'openjdk version "11.0.2" 2019-01-15'))
    with pytest.raises(LabkitSetupError, match=r"Java 11 .* need Java 17 or newer.*apt-get install"):
        jvm.check_java()


def test_missing_java_is_refused_with_install_hint(monkeypatch):
    monkeypatch.delenv("LABKIT_JAVA", raising=False)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(LabkitSetupError, match="Java was not found.*openjdk-17"):
        jvm.check_java()


def test_missing_maven_is_refused_with_install_hint(tmp_path, monkeypatch):
    monkeypatch.delenv("LABKIT_MVN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LabkitSetupError, match=r"Maven \(`mvn`\).*apt-get install maven"):
        jvm.check_maven()


def test_missing_maven_only_matters_when_jars_must_be_fetched(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("LABKIT_MVN", str(tmp_path / "no-mvn-here"))
    with pytest.raises(LabkitSetupError, match="Maven"):
        jvm.resolve("kafka")


def test_port_in_use_is_refused(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} .* in use.*--port"):
            LocalCluster(brokers=1, home=tmp_path, port=port).start()


def test_unreachable_bootstrap_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(ClusterError, match="not reachable.*unset LABKIT_BOOTSTRAP"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=2)


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*LABKIT, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_cli_status_with_unreachable_labkit_bootstrap(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run_cli("status", env={"LABKIT_BOOTSTRAP": f"127.0.0.1:{port}",
                                 "LABKIT_HOME": str(tmp_path)})
    assert out.returncode == 2
    assert "not reachable" in out.stderr


def test_cli_down_when_nothing_runs(tmp_path):
    out = run_cli("down", env={"LABKIT_HOME": str(tmp_path), "LABKIT_BOOTSTRAP": ""})
    assert out.returncode == 0
    assert "nothing to stop" in out.stdout


def test_cli_up_status_down_cycle_reuses_the_running_lab(tmp_path):
    env = {"LABKIT_HOME": str(tmp_path), "LABKIT_BOOTSTRAP": "", "LABKIT_PG_DSN": ""}
    first = run_cli("up", env=env)
    assert first.returncode == 0, first.stderr
    try:
        bootstrap = first.stdout.strip().splitlines()[-1]
        again = run_cli("up", env=env)
        assert again.stdout.strip().splitlines()[-1] == bootstrap  # idempotent: same lab
        assert "already running" in again.stderr
        status = run_cli("status", "--json", env=env)
        import json
        info = json.loads(status.stdout)
        assert info["up"] is True and info["bootstrap"] == bootstrap
        pid = info["brokers"][0]["pid"]
        pg = LabPostgres.attach(tmp_path)  # a new lab gets its PostgreSQL, detached too
        assert pg is not None and pg.detached and "PostgreSQL on 127.0.0.1" in first.stderr
    finally:
        down = run_cli("down", env=env)
    assert down.returncode == 0 and "stopped 1 broker" in down.stdout
    assert not pid_alive(pid)
    assert "stopped the lab's PostgreSQL" in down.stdout and not pg.running
    assert LabPostgres.attach(tmp_path) is None and not (tmp_path / "postgres").exists()


def test_stale_lab_from_a_killed_owner_is_cleaned_up(tmp_path):
    """A kernel that died left a state file behind; the next attach cleans up."""
    code = (
        "import os, sys; from labkit.kafka.localcluster import LocalCluster\n"
        f"c = LocalCluster(brokers=1, home={str(tmp_path)!r}).start()\n"
        "print(c.brokers[0].pid, flush=True); os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    broker_pid = int(out.stdout.split()[0])
    import time
    deadline = time.monotonic() + 15
    while pid_alive(broker_pid) and time.monotonic() < deadline:  # PDEATHSIG reaps it
        time.sleep(0.2)
    assert not pid_alive(broker_pid)
    assert (tmp_path / "cluster.json").exists()
    assert LocalCluster.attach(tmp_path) is None
    assert not (tmp_path / "cluster.json").exists()


def test_owned_broker_is_stopped_when_its_python_process_exits(tmp_path):
    code = (
        "from labkit.kafka.localcluster import LocalCluster\n"
        f"c = LocalCluster(brokers=1, home={str(tmp_path)!r}).start()\n"
        "print(c.brokers[0].pid, flush=True)\n"  # then exit normally: atexit stops it
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    broker_pid = int(out.stdout.split()[0])
    assert not pid_alive(broker_pid)
    assert not (tmp_path / "cluster.json").exists()


def test_a_child_started_from_a_background_thread_outlives_that_thread():
    """PR_SET_PDEATHSIG fires when the forking *thread* ends: children started by a
    dashboard's experiment thread must not be killed when that thread finishes."""
    import threading

    procs = []
    worker = threading.Thread(target=lambda: procs.append(subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(3)"], preexec_fn=die_with_owner())))
    worker.start()
    worker.join()
    import time
    time.sleep(0.5)
    try:
        assert pid_alive(procs[0].pid)
    finally:
        procs[0].kill()
        procs[0].wait()
    assert die_with_owner() is not None  # from the main thread it is armed


def test_a_child_spawned_from_a_thread_that_ended_dies_with_its_owner(tmp_path):
    """A broker a nemesis thread restarted, a worker a pool thread started: when their
    owner dies however it dies (SIGKILL: no clean-up, no atexit), they die too."""
    owner = subprocess.Popen([sys.executable, "-c", (
        "import sys, threading, time\n"
        "from labkit import proc\n"
        "out = []\n"
        "t = threading.Thread(target=lambda: out.append(proc.spawn([sys.executable, '-c', "
        "'import time; time.sleep(60)'])))\n"
        "t.start(); t.join()\n"
        "print(out[0].pid, flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        child = int(owner.stdout.readline())
        import time
        time.sleep(0.5)
        assert pid_alive(child)  # its starting thread ended: it lives on with its owner
    finally:
        owner.kill()
        owner.wait()
    from labkit.progress import wait_until
    wait_until(lambda: not pid_alive(child), "the child's death with its owner", 5)
