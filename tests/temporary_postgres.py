"""TEMPORARY: a PostgreSQL with ``wal_level=logical`` for the Connect/Debezium tests and
benchmarks/connect.py, until the lab's own server (``labkit/storage/postgres.py``) lands.
At the merge, ``temporary_postgres`` is the one thing to swap for the lab's server; nothing
else in the Connect tests starts or stops PostgreSQL.

Debian's server binaries (``apt-get install -y postgresql``; /usr/lib/postgresql/N/bin):
initdb in a fresh directory, then ``postgres`` itself as a child of this process (not
pg_ctl's daemon), on 127.0.0.1 and a free port, so it dies with its owner (PR_SET_PDEATHSIG)
even when the owner is killed; stopped (fast shutdown) and removed on every other way out.
PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg

from labkit.kafka.ports import free_port

# Debezium reads the WAL through a logical replication slot (pgoutput): wal_level=logical.
SERVER_OPTIONS = ("-c", "max_wal_senders=10", "-c", "max_replication_slots=10", "-c", "fsync=off",
                  "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
MARK = "labkit-connect-pg"  # in its data directory's name: what `servers_left` looks for
READY_TIMEOUT_S = 60.0


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


def _owner() -> pwd.struct_passwd | None:
    return pwd.getpwnam("postgres") if os.geteuid() == 0 else None


def _as_owner_then_die_with_parent() -> None:  # runs in the child between fork and exec
    owner = _owner()
    if owner is not None:
        os.setgid(owner.pw_gid)
        os.setuid(owner.pw_uid)
    # after setuid: a change of credentials clears the parent-death signal
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def temporary_postgres(wal_level: str = "logical") -> Iterator[str]:
    """A running server; yields its DSN (superuser ``labkit``, database ``postgres``)."""
    binaries = bin_dir()
    owner = _owner()
    where = Path(tempfile.mkdtemp(prefix=f"{MARK}-"))
    if owner is not None:
        os.chown(where, owner.pw_uid, owner.pw_gid)
    data, port = where / "data", free_port()
    server: subprocess.Popen | None = None
    try:
        initdb = [str(binaries / "initdb"), "-D", str(data), "-U", "labkit", "--auth=trust",
                  "-E", "UTF8"]
        subprocess.run((["runuser", "-u", "postgres", "--"] if owner else []) + initdb,
                       check=True, capture_output=True, timeout=120)
        with open(where / "server.log", "ab") as log:
            server = subprocess.Popen(
                [str(binaries / "postgres"), "-D", str(data), "-c", "listen_addresses=127.0.0.1",
                 "-c", f"port={port}", "-c", f"unix_socket_directories={where}",
                 "-c", f"wal_level={wal_level}", *SERVER_OPTIONS],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_as_owner_then_die_with_parent)
        dsn = f"postgresql://labkit@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                psycopg.connect(dsn, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start: {(where / 'server.log').read_text()[-2000:]}")
                time.sleep(0.1)
        yield dsn
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGINT)  # fast shutdown: sessions ended, no checkpoint wait
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
        shutil.rmtree(where, ignore_errors=True)


def servers_left() -> list[str]:
    """Command lines of the PostgreSQL servers these helpers started that still run."""
    left = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or ())
        if "postgres" in cmd and MARK in cmd:
            left.append(cmd)
    return left
