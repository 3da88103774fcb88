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

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
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


# --------------------------------------------------------------------------- a server's state
# A server the lab starts (the brokers, PostgreSQL) writes where it runs to a state file in
# the lab home, where later processes (a kernel, `labkit down`) find it.

def save_state(home: Path, name: str, state: dict, private: bool = False) -> None:
    """Write ``home/name`` whole, then rename it: a reader never sees half a state file.
    ``private``: readable by its owner only (it holds a password)."""
    tmp = home / f".{name}.{os.getpid()}"
    tmp.write_text(json.dumps(state, indent=2))
    if private:
        tmp.chmod(0o600)
    os.replace(tmp, home / name)


def load_state(home: Path | None, name: str) -> tuple[Path, dict | None]:
    """The lab home (``home`` or ``lab_home()``) and the state in its file ``name`` (None: none)."""
    home = Path(home) if home else lab_home()
    path = home / name
    return home, (json.loads(path.read_text()) if path.exists() else None)


@contextlib.contextmanager
def home_lock(name: str, home: Path | None = None) -> Iterator[None]:
    """Held while one process looks for a server in the lab home and starts it if there is
    none: two kernels starting at the same moment would otherwise both find nothing and both
    start one in the same directories; with the lock the second waits, then attaches."""
    home = Path(home) if home else lab_home()
    with open(home / name, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes, also if we die
        yield
