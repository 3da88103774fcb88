"""The startup archives `labkit setup` saves (labkit.kafka.startup_archive): the JVMs the lab
starts map them, and a JVM that cannot use one still starts."""
from __future__ import annotations

import subprocess

import pytest

from labkit import settings
from labkit.kafka import broker, jvm, startup_archive
from labkit.spark.session import driver_classpath_key


def test_setup_made_an_archive_that_a_broker_jvm_can_map(tmp_path):
    """-Xshare:on makes the JVM refuse to start when it cannot map the archive (another
    classpath, another JDK): so this fails if setup's archive does not fit the broker."""
    java, classpath = jvm.check_java(), jvm.classpath("kafka")
    options = startup_archive.use_options("broker", java, classpath)
    assert options, "make setup saves the broker's archive; run `labkit setup`"
    b = broker.Broker(node_id=1, port=0, controller_port=0, dir=str(tmp_path))
    command = broker.jvm_command(java, classpath, b, ["kafka.Kafka", "--version"])
    assert options[0] in command
    command.insert(1, "-Xshare:on")
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "4." in out.stdout, out.stdout + out.stderr


def test_setup_made_a_spark_archive_for_this_pyspark():
    java = jvm.check_java()
    path = startup_archive.archive_file("spark", java, driver_classpath_key())
    assert path.is_file() and path.stat().st_size > 1_000_000, path


def test_a_jvm_with_an_archive_it_cannot_use_still_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    java = jvm.check_java()
    path = startup_archive.archive_file("broker", java, "elsewhere.jar")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an archive")
    out = subprocess.run([java, *startup_archive.use_options("broker", java, "elsewhere.jar"),
                          "-version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_broker_jvm_options_come_from_the_settings(tmp_path, monkeypatch):
    b = broker.Broker(node_id=1, port=0, controller_port=0, dir=str(tmp_path))
    assert "-XX:TieredStopAtLevel=1" in broker.jvm_command("java", "cp", b, ["x"])
    monkeypatch.setenv("LABKIT_BROKER_JAVA_OPTS", "-XX:+UseG1GC")
    command = broker.jvm_command("java", "cp", b, ["x"])
    assert "-XX:+UseG1GC" in command and "-XX:TieredStopAtLevel=1" not in command
    assert settings.current().broker_java_opts == "-XX:+UseG1GC"


@pytest.mark.parametrize("kind", ["broker", "spark"])
def test_making_writes_the_archive_and_otherwise_maps_it(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    with startup_archive.making(kind):
        (dump,) = startup_archive.options(kind, "java", "cp")
    assert dump.startswith("-XX:ArchiveClassesAtExit=")
    assert startup_archive.options(kind, "java", "cp") == []  # not made: nothing to map
    path = startup_archive.archive_file(kind, "java", "cp")
    path.write_bytes(b"x")
    assert startup_archive.options(kind, "java", "cp") == [f"-XX:SharedArchiveFile={path}"]
