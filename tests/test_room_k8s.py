"""The Kubernetes path (docs/room.md, "Past one machine"): deploy/z2jh/values.yaml checked
against deploy/z2jh/values.schema.yaml, the lab's own schema of the chart values it sets
(written from Zero to JupyterHub's configuration reference for chart 4.4.0), since neither
the chart nor helm could be fetched here: the chart is not on any registry this machine
reaches (the Go module proxy refuses its repository).

Beyond the schema: the values agree with the lab (the settings labkit reads, where the
secure room's client files point, the image's Dockerfile) and hold no secret.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from labkit import settings
from labkit.room import secure_cluster

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "z2jh"


@pytest.fixture(scope="module")
def values() -> dict:
    return yaml.safe_load((DEPLOY / "values.yaml").read_text())


@pytest.fixture(scope="module")
def schema() -> dict:
    return yaml.safe_load((DEPLOY / "values.schema.yaml").read_text())


def test_values_pass_the_schema(values, schema) -> None:
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(values), key=str)
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_schema_catches_a_misspelt_key_and_a_wrong_type(values, schema) -> None:
    """The check has teeth: a key the chart does not have, or a value of the wrong type."""
    wrong = copy.deepcopy(values)
    wrong["singleuser"]["memmory"] = {"limit": "4G"}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(wrong))
    wrong = copy.deepcopy(values)
    wrong["cull"]["timeout"] = "an hour"
    assert list(jsonschema.Draft7Validator(schema).iter_errors(wrong))


def test_values_agree_with_the_lab(values) -> None:
    user = values["singleuser"]
    env = user["extraEnv"]
    known = set(re.findall(r"LABKIT_[A-Z_]+", (ROOT / "labkit" / "settings.py").read_text()))
    known |= set(re.findall(r"LABKIT_[A-Z_]+", (ROOT / "labkit" / "paths.py").read_text()))
    assert set(env) <= known, set(env) - known  # every variable one labkit reads
    assert env[settings.NAMESPACE] == "{username}"  # KubeSpawner's per-learner expansion
    # the learner's Secret is mounted where the room's generated files say ca.pem is
    mount = user["storage"]["extraVolumeMounts"][0]["mountPath"]
    assert mount == f"{secure_cluster.MOUNT}/clients"
    assert env[settings.KAFKA_CONFIG].startswith(mount + "/")
    assert user["storage"]["extraVolumes"][0]["secret"]["secretName"].endswith("{username}")
    # the image is the lab's: its Dockerfile installs the dev extra, which has jupyterhub
    assert user["image"]["name"].endswith("delivery-lab-jupyter")
    assert "'.[dev]'" in (ROOT / "docker" / "jupyter.Dockerfile").read_text()
    assert user["cmd"] == "jupyterhub-singleuser"
    assert values["cull"]["enabled"] and user["memory"]["limit"]


def test_values_hold_no_secret() -> None:
    text = (DEPLOY / "values.yaml").read_text()
    assert not re.search(r"(?im)^\s*[\w.]*(password|secret_token|api_token)\s*:", text)
