"""A virtualenv of its own for an app the lab runs whose pins clash with the lab's: created
once under .cache/apps/NAME-venv from exactly the requirements given, reused while they stay
the same, the pip download shown as a progress line.

    python = app_env("quixstreams", ("quixstreams==3.28.1", "confluent-kafka==2.12.2"))
    subprocess.run([str(python), "app.py"])

quixstreams (``labkit.torture.apps``) needs an older confluent-kafka than the lab pins;
PyFlink (``labkit.flink``) older pandas and pyarrow. Like any user's app, each gets an
environment of its own and the lab's pins do not move for it.
"""
from __future__ import annotations

import fcntl
import hashlib
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from labkit import proc
from labkit.paths import LabkitSetupError, cache_dir
from labkit.progress import status


def env_home(name: str) -> Path:
    return cache_dir() / "apps" / f"{name}-venv"


def _stamp(name: str, requirements: Sequence[str]) -> Path:
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:12]
    return env_home(name) / f".installed-{key}"


def is_ready(name: str, requirements: Sequence[str]) -> bool:
    """Is NAME's environment there with exactly ``requirements`` (nothing to install)?"""
    return _stamp(name, requirements).exists()


def app_env(name: str, requirements: Sequence[str]) -> Path:
    """The Python of a virtualenv of its own for an app under test, created once under
    .cache/apps/NAME-venv with exactly ``requirements`` (pip) and reused while they stay the
    same (a stamp file named after their hash). Returns the environment's python."""
    home = env_home(name)
    python = home / "bin" / "python"
    stamp = _stamp(name, requirements)
    if stamp.exists():
        return python
    home.parent.mkdir(parents=True, exist_ok=True)
    # Two test processes (or a notebook and a test) may ask at once: one builds, one waits.
    with open(home.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists():
            return python
        title = f"{name}: creating its own environment in {home}, once"
        with status(title) as progress:
            progress(f"{name}: venv (1/2)")
            _run([sys.executable, "-m", "venv", "--clear", str(home)], name, progress)
            progress(f"{name}: pip install {len(requirements)} pinned packages (2/2)")
            _run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                  "--progress-bar", "off", *requirements], name, progress)
        for old in home.glob(".installed-*"):
            old.unlink()
        stamp.touch()
    return python


def _run(step: list[str], name: str, progress) -> None:
    """Run one step, its download lines as progress ("Downloading pandas-2.2.3 (13.1 MB)")."""
    lines: list[str] = []
    child = proc.spawn(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout is not None
    downloads = 0
    try:
        for line in child.stdout:
            lines.append(line.rstrip())
            if line.lstrip().startswith("Downloading "):
                downloads += 1
                wheel = line.split()[1].rsplit("/", 1)[-1]
                size = line.rsplit("(", 1)[-1].rstrip(")\n") if "(" in line else ""
                progress(f"{name}: pip install: {downloads} downloaded, now {wheel} ({size})")
        code = child.wait()
    except BaseException:  # Ctrl-C in a notebook: pip must not go on alone
        proc.stop([child], timeout_s=5)
        raise
    if code != 0:
        raise LabkitSetupError(
            f"creating {name}'s environment failed ({shlex.join(step[:6])} ..., exit {code}); "
            "is PyPI reachable? Its last lines:\n" + "\n".join(lines[-10:]))
