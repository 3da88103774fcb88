"""The LABKIT_* environment is read in one place (labkit.settings), at call time."""
from __future__ import annotations

import getpass
import re
from pathlib import Path

import pytest

from labkit import settings

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


def test_namespace_local_lab_external_cluster_and_explicit(monkeypatch):
    monkeypatch.delenv("LABKIT_NAMESPACE", raising=False)
    monkeypatch.delenv("LABKIT_BOOTSTRAP", raising=False)
    assert settings.current().namespace == ""          # the lessons' own names on a laptop
    monkeypatch.setenv("LABKIT_BOOTSTRAP", "kafka.example:9092")
    expected = re.sub(r"[^a-zA-Z0-9_-]", "-", getpass.getuser())
    assert settings.current().namespace == expected    # a shared cluster: one per login
    monkeypatch.setenv("LABKIT_NAMESPACE", "alice")
    assert settings.current().namespace == "alice"


@pytest.mark.parametrize("name, value, says", [
    ("LABKIT_NAMESPACE", "alice smith", "letters, digits"),
    ("LABKIT_NAMESPACE", "-alice", "starting with a letter"),
    ("LABKIT_CRASH_HIT", "two", "whole number"),
    ("LABKIT_SPARK_REMOTE", "127.0.0.1:15002", "sc://host:port"),
])
def test_a_bad_value_names_the_variable_and_the_fix(monkeypatch, name, value, says):
    monkeypatch.setenv(name, value)
    with pytest.raises(settings.SettingsError) as err:
        now = settings.current()
        (now.namespace, now.spark_remote)
    assert name in str(err.value) and says in str(err.value)
