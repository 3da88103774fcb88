"""Where the lab keeps things: the pinned JVM dependencies, the jar cache, lab state.

Everything is derived from two environment variables so the same code works from a git
checkout, inside the Jupyter container and in CI:

- ``LABKIT_PROJECT``: the repository root (holds ``jvm/pom.xml``); found automatically
  when labkit is installed from a checkout.
- ``LABKIT_HOME``: where running clusters keep data dirs, logs and the state file
  (default ``<project>/.lab``). Tests point it at a temp dir so they never touch a lab
  an instructor has running.
"""
from __future__ import annotations

from pathlib import Path

from labkit import settings


class LabkitSetupError(RuntimeError):
    """Something the lab needs is missing; the message says how to fix it."""


def project_root() -> Path:
    explicit = settings.current().project
    candidates = [explicit] if explicit else []
    candidates.append(Path(__file__).resolve().parents[1])
    for root in candidates:
        if (root / "jvm" / "pom.xml").is_file():
            return root
    raise LabkitSetupError(
        "cannot find the lab project (jvm/pom.xml). Install labkit from a checkout "
        "(pip install -e .) or set LABKIT_PROJECT to the repository root."
    )


def pom_file() -> Path:
    return project_root() / "jvm" / "pom.xml"


def cache_dir() -> Path:
    """The copied jars, startup archives and app environments; gitignored, reused by later
    runs (the Maven repository itself is Maven's own, ~/.m2)."""
    return settings.current().cache or project_root() / ".cache"


def lab_home() -> Path:
    home = settings.current().home or project_root() / ".lab"
    home.mkdir(parents=True, exist_ok=True)
    return home


def spark_remote() -> str | None:
    """``LABKIT_SPARK_REMOTE``: a Spark Connect server (``sc://host:port``) the Spark lessons
    use instead of starting their own driver; None when unset (a local driver)."""
    try:
        return settings.current().spark_remote
    except settings.SettingsError as wrong:
        raise LabkitSetupError(str(wrong)) from None
