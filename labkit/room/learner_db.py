"""Each learner's PostgreSQL in a room: a role of its own (login, a new password at each
spawn, no superuser, no CREATEDB, no REPLICATION) owning a schema of its own name, and a DSN
whose ``search_path`` is that schema. Made by the hub's spawner (``labkit.room.hubconfig``)
as the lab's PostgreSQL superuser, before the learner's server starts; the DSN is its
``LABKIT_PG_DSN``, so a lesson's ``postgres.ensure()`` gives it and ``fresh_schema`` makes
its per-run schemas as that role (it may CREATE in the database, so their owner is it).

What the server enforces: a schema's tables are its owner's; another learner's role gets
``permission denied for schema learner01`` (no USAGE on it), and cannot drop or alter
another's schemas (not the owner). What it does not: the catalog (``pg_class``,
``information_schema``) lists every schema's and table's *names* to every role, as
PostgreSQL does for everyone; and the room's roles share one database, its connections
and its disk; and since every learner's kernel runs as the instructor's one system user, it
can read the lab's ``postgres.json`` (the superuser's password) as it can read the other
learners' homes (``labkit.room.hubconfig``). Logical replication (05d's Debezium connector) needs the REPLICATION
attribute, which would let a role read the whole server's WAL: learners' roles do not get
it, so 05d's outbox run is refused by the server in a room (docs/room.md).
"""
from __future__ import annotations

import secrets
import threading
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

from labkit.storage import postgres
from labkit.storage.db import Database, identifier

PASSWORD_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"
# Learners spawned at once: two GRANTs on one database at the same moment fail with "tuple
# concurrently updated" (both rewrite its ACL), so the hub's spawns make roles one by one.
_ONE_AT_A_TIME = threading.Lock()


def admin_dsn(lab_home_dir: str | None, external: str | None = None) -> str | None:
    """The superuser DSN the hub makes roles with: the instructor's LABKIT_PG_DSN, else the
    lab's PostgreSQL running in the lab home; None when neither is there."""
    if external:
        return external
    server = postgres.running(Path(lab_home_dir) if lab_home_dir else None)
    return server.dsn() if server else None


def learner_dsn(admin: str, name: str) -> str:
    """Role and schema ``name`` made (or kept: a learner's tables outlive its server) with a
    new password; the DSN its server gets, whose unqualified names mean its schema."""
    role = identifier(name)  # learnerNN: also safe to splice as SQL
    password = "".join(secrets.choice(PASSWORD_ALPHABET) for _ in range(20))
    with _ONE_AT_A_TIME, Database(admin) as db:
        if not db.query("SELECT 1 FROM pg_roles WHERE rolname = ?", (role,)):
            db.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                       "NOREPLICATION")
        # the alphabet has no quote: the literal is safe (ALTER ROLE takes no parameters)
        db.execute(f"ALTER ROLE {role} PASSWORD '{password}'")
        db.execute(f"CREATE SCHEMA IF NOT EXISTS {role} AUTHORIZATION {role}")
        database = urlsplit(admin).path.lstrip("/") or "postgres"
        # lessons make a schema per run (postgres.fresh_schema) beside the learner's own
        if not db.query("SELECT has_database_privilege(?, ?, 'CREATE')", (role, database))[0][0]:
            db.execute(f"GRANT CREATE ON DATABASE {identifier(database)} TO {role}")
    url = urlsplit(admin)
    host = url.hostname or "127.0.0.1"
    netloc = f"{role}:{password}@{host}" + (f":{url.port}" if url.port else "")
    query = urlencode([("options", f"-c search_path={role}")], quote_via=quote)
    return url._replace(netloc=netloc, query=query).geturl()
