"""The dev container (.devcontainer/devcontainer.json) sets up what the README's two commands
need, and its post-create command is one this test runs here, on the project's own files."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]
SPEC = json.loads((ROOT / ".devcontainer" / "devcontainer.json").read_text())


def test_the_container_has_python_311_java_17_and_maven_and_forwards_the_lab_ports():
    assert SPEC["image"].startswith("mcr.microsoft.com/devcontainers/python:") and "3.11" in SPEC["image"]
    java = SPEC["features"]["ghcr.io/devcontainers/features/java:1"]
    assert (java["version"], java["installMaven"]) == ("17", "true")
    assert {8888, 4040} <= set(SPEC["forwardPorts"])  # JupyterLab, the Spark UI
    makefile = (ROOT / "Makefile").read_text()
    assert "--ip=127.0.0.1" in makefile and "8888" in (ROOT / "README.md").read_text()


def test_the_post_create_command_is_the_readmes_setup_and_runs_here():
    command = SPEC["postCreateCommand"]
    assert command == "make setup"  # the first half of `make lab` and of `make test`
    makefile = (ROOT / "Makefile").read_text()
    assert "lab: setup" in makefile and "test: setup test-deps" in makefile
    done = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "MAKEFLAGS": ""})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (ROOT / ".venv" / "bin" / "labkit").exists()
    assert "kafka:" in done.stdout and "jars in" in done.stdout  # the jars are there
