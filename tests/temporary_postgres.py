"""TEMPORARY: a PostgreSQL with ``wal_level=logical`` for the Connect/Debezium tests and
benchmarks/connect.py, until the lab's own server (``labkit/storage/postgres.py``) lands.
At the merge, ``temporary_postgres`` is the one thing to swap for the lab's server; nothing
else in the Connect tests starts or stops PostgreSQL.

Debian's server binaries (``apt-get install -y postgresql``; /usr/lib/postgresql/N/bin):
initdb and pg_ctl in a fresh directory, 127.0.0.1 and a free port only, stopped
(``immediate``: its data is thrown away) and removed on every way out. PostgreSQL refuses
to run as root, so as root the server runs as the ``postgres`` user, as
scripts/pg-local.sh does.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from labkit.kafka.ports import free_port

# Debezium reads the WAL through a logical replication slot (pgoutput): wal_level=logical.
SERVER_OPTIONS = ("-c max_wal_senders=10 -c max_replication_slots=10 "
                  "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
MARK = "labkit-connect-pg"  # in its data directory's name: what `servers_left` looks for


def bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise RuntimeError("PostgreSQL server binaries are not installed: apt-get install -y "
                       "postgresql (scripts/install-test-deps.sh)")


def _as_owner(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextlib.contextmanager
def temporary_postgres(wal_level: str = "logical") -> Iterator[str]:
    """A running server; yields its DSN (superuser ``labkit``, database ``postgres``)."""
    binaries = bin_dir()
    where = Path(tempfile.mkdtemp(prefix=f"{MARK}-"))
    if os.geteuid() == 0:
        shutil.chown(where, "postgres", "postgres")
    data = where / "data"
    port = free_port()
    try:
        subprocess.run(_as_owner([str(binaries / "initdb"), "-D", str(data), "-U", "labkit",
                                  "--auth=trust", "-E", "UTF8"]),
                       check=True, capture_output=True, timeout=120)
        subprocess.run(_as_owner([str(binaries / "pg_ctl"), "-D", str(data), "-l",
                                  str(where / "server.log"), "-w", "-t", "60", "start", "-o",
                                  f"-c listen_addresses=127.0.0.1 -c port={port} "
                                  f"-c unix_socket_directories={where} -c wal_level={wal_level} "
                                  f"{SERVER_OPTIONS}"]),
                       check=True, capture_output=True, timeout=90)
        yield f"postgresql://labkit@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(_as_owner([str(binaries / "pg_ctl"), "-D", str(data), "-m",
                                      "immediate", "-w", "stop"]), capture_output=True,
                           timeout=60)
        shutil.rmtree(where, ignore_errors=True)


def servers_left() -> list[str]:
    """Command lines of the PostgreSQL servers these helpers started that still run."""
    import psutil

    left = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or ())
        if "postgres" in cmd and MARK in cmd:
            left.append(cmd)
    return left
