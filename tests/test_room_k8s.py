"""The Kubernetes path (docs/room.md, "Past one machine"): deploy/z2jh/values.yaml checked
against Zero to JupyterHub's own values schema, merged over the chart's defaults as helm
merges them, since neither the chart nor helm could be fetched here (the chart is not on
any registry this machine reaches: the Go module proxy refuses its repository). The chart's
schema and defaults are in deploy/z2jh/chart-4.4.0/, copied from its 4.4.0 tag.

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


def helm_merge(defaults: dict, given: dict) -> dict:
    """helm's coalescing of a user's values over a chart's: maps merged key by key, any
    other value (lists included) replaced, a null removing the chart's key."""
    merged = copy.deepcopy(defaults)
    for key, value in given.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = helm_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@pytest.fixture(scope="module")
def values() -> dict:
    return yaml.safe_load((DEPLOY / "values.yaml").read_text())


@pytest.fixture(scope="module")
def merged(values) -> dict:
    return helm_merge(yaml.safe_load((DEPLOY / "chart-4.4.0" / "values.yaml").read_text()), values)


def test_values_pass_the_charts_schema(merged) -> None:
    schema = yaml.safe_load((DEPLOY / "chart-4.4.0" / "values.schema.yaml").read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(merged), key=str)
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_schema_catches_a_misspelt_key(merged) -> None:
    """The check has teeth: the chart's schema refuses keys it does not know."""
    schema = yaml.safe_load((DEPLOY / "chart-4.4.0" / "values.schema.yaml").read_text())
    wrong = copy.deepcopy(merged)
    wrong["singleuser"]["memmory"] = {"limit": "4G"}
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
