"""The LABKIT_* environment is read in one place (labkit.settings), at call time."""
from __future__ import annotations

import getpass
import re
from pathlib import Path

import pytest

from labkit import settings

from labkit.kafka import names

PACKAGE = Path(settings.__file__).parent


def test_no_other_module_reads_the_labkit_environment():
    # A read looks like environ.get("LABKIT_...") / environ["LABKIT_..."] / getenv("LABKIT_...");
    # writes into a child's environment (env[...] = ...) are the lab starting a process.
    read = re.compile(r"""(environ\.get|getenv)\(\s*["']LABKIT_|environ\[["']LABKIT_[A-Z_]+["']\](?!\s*=)""")
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{number}"
                 for path in PACKAGE.rglob("*.py") if path.name != "settings.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if read.search(line)]
    assert offenders == []


def test_a_variable_set_after_import_is_seen_on_the_next_call(monkeypatch):
    monkeypatch.setenv("LABKIT_BROKER_HEAP", "768m")
    monkeypatch.setenv("LABKIT_CRASH_HIT", "3")
    now = settings.current()
    assert (now.broker_heap, now.crash_hit) == ("768m", 3)
    monkeypatch.delenv("LABKIT_BROKER_HEAP")
    assert settings.current().broker_heap == "512m"


def test_namespace_local_lab_external_cluster_credentials_and_explicit(monkeypatch, tmp_path):
    monkeypatch.delenv("LABKIT_NAMESPACE", raising=False)
    monkeypatch.delenv("LABKIT_BOOTSTRAP", raising=False)
    monkeypatch.delenv("LABKIT_KAFKA_CONFIG", raising=False)
    assert names.namespace() == ""                     # the lessons' own names on a laptop
    monkeypatch.setenv("LABKIT_BOOTSTRAP", "kafka.example:9092")
    expected = re.sub(r"[^a-zA-Z0-9_-]", "-", getpass.getuser())
    assert names.namespace() == expected               # a shared cluster: one per login
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                      "sasl.username=learner07\nsasl.password=secret\n")
    monkeypatch.setenv("LABKIT_KAFKA_CONFIG", str(config))
    assert names.namespace() == "learner07"            # what a room's prefixed ACLs grant
    monkeypatch.setenv("LABKIT_NAMESPACE", "alice")
    assert names.namespace_and_source() == ("alice", "from LABKIT_NAMESPACE")
    monkeypatch.setenv("LABKIT_NAMESPACE", "")
    assert names.namespace() == ""                     # set empty: none, even here


@pytest.mark.parametrize("name, value, says", [
    ("LABKIT_NAMESPACE", "alice smith", "letters, digits"),
    ("LABKIT_NAMESPACE", "-alice", "starting with a letter"),
    ("LABKIT_CRASH_HIT", "two", "whole number"),
    ("LABKIT_SPARK_REMOTE", "127.0.0.1:15002", "sc://host:port"),
])
def test_a_bad_value_names_the_variable_and_the_fix(monkeypatch, name, value, says):
    monkeypatch.setenv(name, value)
    with pytest.raises(settings.SettingsError) as err:
        settings.current().spark_remote
        names.namespace()
    assert name in str(err.value) and says in str(err.value)


def test_a_warm_child_takes_the_connection_variables_as_they_are_now(monkeypatch):
    # A Spark worker started before the learner set LABKIT_NAMESPACE / LABKIT_KAFKA_CONFIG
    # applies the kernel's values with each job; "unset" and "set empty" stay different.
    monkeypatch.setenv("LABKIT_NAMESPACE", "alice")
    monkeypatch.setenv("LABKIT_KAFKA_CONFIG", "/tmp/client.properties")
    sent = settings.connection_env()
    monkeypatch.setenv("LABKIT_NAMESPACE", "")
    monkeypatch.delenv("LABKIT_KAFKA_CONFIG")
    settings.apply_connection_env(sent)
    now = settings.current()
    assert (names.namespace(), str(now.kafka_config)) == ("alice", "/tmp/client.properties")
    monkeypatch.delenv("LABKIT_NAMESPACE")
    monkeypatch.delenv("LABKIT_KAFKA_CONFIG")
    unset = settings.connection_env()
    monkeypatch.setenv("LABKIT_NAMESPACE", "")
    monkeypatch.setenv("LABKIT_BOOTSTRAP", "kafka.example:9092")
    settings.apply_connection_env(unset)
    assert names.namespace() != ""  # unset again: the login-name default is back
