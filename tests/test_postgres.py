"""The lab's own PostgreSQL (labkit.storage.postgres) and the storage adapter on it: the
server the test process shares (conftest.py), what it is configured with, a kernel-like
process attaching to it, the consumer pipeline and the audit on a PostgreSQL table, and no
server process left after a test run that passed, failed, was interrupted or was killed."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from labkit import settings
from labkit.checking.audit import audit_table
from labkit.paths import LabkitSetupError
from labkit.pipelines import consumer, data
from labkit.storage import postgres, server_user
from labkit.storage.db import Database, read_table

ROOT = Path(__file__).resolve().parents[1]
lab_only = pytest.mark.skipif(bool(settings.current().pg_dsn),
                              reason="LABKIT_PG_DSN names a server of your own")


@lab_only
def test_the_lab_server_is_loopback_only_logical_and_wants_its_password(pg_dsn):
    with Database(pg_dsn) as db:
        shown = {name: db.query(f"SHOW {name}")[0][0] for name in
                 ("wal_level", "listen_addresses", "unix_socket_directories",
                  "max_replication_slots", "max_wal_senders", "server_version")}
    assert shown["wal_level"] == "logical"  # what Debezium reads
    assert shown["listen_addresses"] == "127.0.0.1" and shown["unix_socket_directories"] == ""
    assert int(shown["max_replication_slots"]) >= 4 and int(shown["max_wal_senders"]) >= 4
    assert shown["server_version"].startswith("18.")  # the wheel's, not the system's
    wrong = pg_dsn.replace(postgres.LabPostgres.attach().password, "wrong")
    with pytest.raises(Exception, match="password authentication failed"):
        Database(wrong)


@lab_only
def test_a_kernel_attaches_to_the_running_server_instead_of_starting_one(pg_dsn):
    code = "from labkit.storage import postgres; print(postgres.ensure())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == pg_dsn
    assert "Starting PostgreSQL" not in out.stderr


def test_a_fresh_database_is_empty_each_time(pg_dsn):
    name = f"fresh_{uuid.uuid4().hex[:8]}"
    url = postgres.fresh_database(name, pg_dsn)
    with Database(url) as db:
        db.execute("CREATE TABLE t (id TEXT)")
        assert db.query("SELECT current_database()") == [(name,)]
    again = postgres.fresh_database(name, pg_dsn)
    assert again == url
    with Database(again) as db:
        assert db.query("SELECT COUNT(*) FROM information_schema.tables "
                        "WHERE table_name = 't'") == [(0,)]


def test_the_table_audit_reads_postgres_as_it_reads_sqlite(pg_dsn, tmp_path):
    """The same rows in both databases, the same audit: in insertion order, by id."""
    rows = [("x0", "a"), ("x2", "a"), ("x1", "b"), ("x2", "a")]
    inputs = [{"id": f"x{i}", "key": "a"} for i in range(4)]
    reports = []
    for url in (str(tmp_path / "sink.db"), postgres.fresh_database("audit_same", pg_dsn)):
        with Database(url) as db:
            db.execute(f"CREATE TABLE sink ({db.sequence_column('seq')}, id TEXT, key TEXT)")
            db.executemany("INSERT INTO sink (id, key) VALUES (?, ?)", rows)
        assert list(read_table(url, "sink", ["id"])["id"]) == ["x0", "x2", "x1", "x2"]
        reports.append(audit_table(url, "sink", inputs, "t", "at_least_once"))
    sqlite, pg = reports
    assert (pg.lost, pg.duplicated, pg.reordered) == (1, 1, 0)
    assert pg.examples["lost"] == ["x3"] and pg.to_dict() == sqlite.to_dict()


def test_a_postgres_table_without_an_insertion_order_is_refused(pg_dsn):
    url = postgres.fresh_database("no_order", pg_dsn)
    with Database(url) as db:
        db.execute("CREATE TABLE sink (id TEXT, key TEXT)")
    with pytest.raises(ValueError, match="no identity column"):
        read_table(url, "sink")


def test_the_consumer_writes_its_rows_and_offsets_into_postgres(bootstrap, pg_dsn):
    """The consumer pipeline's exactly_once mode on PostgreSQL: rows and next offsets in
    one database transaction per batch; the audit reads the table back exact."""
    topic = f"pg-in-{uuid.uuid4().hex[:8]}"
    inputs = data.generate(30, seed=7)
    data.load_into_topic(bootstrap, topic, inputs, partitions=2)
    url = postgres.fresh_database("consumer_sink", pg_dsn)
    consumer.run(bootstrap, topic, f"{topic}-group", url, "exactly_once", batch_size=7)
    report = audit_table(url, consumer.SINK_TABLE, inputs, "consumer", "exactly_once")
    assert (report.produced, report.delivered_unique, report.lost, report.duplicated) == (30, 30, 0, 0)
    with Database(url) as db:
        stored = consumer.stored_offsets(db, topic)
        (rows,), = db.query(f"SELECT COUNT(*) FROM {consumer.SINK_TABLE}")
    assert rows == 30 and sum(stored.values()) == 30  # next offset per partition = its count


# ------------------------------------------------------------------ no server left behind
NESTED_TEST = '''
import json, os, signal, time
import psutil
from labkit.storage import postgres

def test_uses_the_server(pg_dsn):
    server = postgres.LabPostgres.attach()
    family = [server.pid] + [c.pid for c in psutil.Process(server.pid).children(recursive=True)]
    with open(os.environ["PG_FAMILY"], "w") as fh:
        json.dump({"home": os.environ["LABKIT_HOME"],
                   "sigint": str(signal.getsignal(signal.SIGINT)),
                   "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
                   "family": [(pid, psutil.Process(pid).create_time()) for pid in family]}, fh)
    how = os.environ["HOW"]
    if how == "interrupt":
        time.sleep(60)  # the outer test sends SIGINT now, as Ctrl-C does
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # no sessionfinish, no atexit: only the kernel
    assert how == "pass"
'''


def _as_from_a_terminal() -> None:
    """The nested run gets SIGINT as a shell's child does: default, unblocked. In the full
    suite (two fresh clones) it slept through every SIGINT, so this test process had come
    to ignore or block it (a disposition and a mask survive exec); the nested run records
    both in its JSON."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def _written(path) -> bool:
    """Has the nested test written its whole JSON (the file exists from its open() on)?"""
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def _alive(family: list) -> list[int]:
    found = []
    for pid, started in family:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - started) < 0.05 and p.status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


@lab_only
@pytest.mark.parametrize("how", ["pass", "fail", "interrupt", "kill"])
def test_no_postgres_process_is_left_after_a_test_run(how, tmp_path, bootstrap):
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_nested.py").write_text(textwrap.dedent(NESTED_TEST))
    family_file = tmp_path / "family.json"
    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap, "HOW": how,  # reuse this broker
           "PG_FAMILY": str(family_file)}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "test_nested.py", "-p",
                            "no:cacheprovider", "-q"], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           preexec_fn=_as_from_a_terminal)
    try:
        if how == "interrupt":
            deadline = time.monotonic() + 120
            while not _written(family_file) and time.monotonic() < deadline:
                time.sleep(0.1)
            # Ctrl-C, again every 10 s until it exits, as a user would (its cleanup, the
            # server's stop, takes seconds under load: a Ctrl-C 2 s later once ended it by
            # the signal, -2, its server gone all the same)
            while run.poll() is None and time.monotonic() < deadline + 30:
                run.send_signal(signal.SIGINT)
                try:
                    run.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        out, _ = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
    seen = json.loads(family_file.read_text())
    family = seen["family"]
    assert len(family) >= 3, out  # the postmaster and its own processes were seen
    deadline = time.monotonic() + 10  # a killed owner's server goes by PR_SET_PDEATHSIG
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _alive(family)
    shutil.rmtree(seen["home"], ignore_errors=True)  # a killed run's data directory too
    assert left == [], out
    assert run.returncode in {"pass": (0,), "fail": (1,), "interrupt": (2, -signal.SIGINT),
                              "kill": (-9,)}[how], \
        (seen["sigint"], seen["blocked"], out)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root needs another user to run PostgreSQL")
def test_as_root_without_user_namespaces_it_runs_as_nobody_or_says_why():
    home = Path(tempfile.mkdtemp(prefix="labkit-pg-nobody-"))
    home.chmod(0o755)  # mkdtemp's 0700 would keep nobody out
    try:
        try:
            runner = server_user.run_as([postgres.binaries(), home], namespaces=False)
        except LabkitSetupError as refused:  # the checkout is where nobody cannot go
            assert "cannot reach" in str(refused) and "LABKIT_PG_DSN" in str(refused)
            return
        server = postgres.LabPostgres(home, runner=runner).start()
        try:
            assert psutil.Process(server.pid).username() == server_user.SERVER_USER
            with Database(server.dsn()) as db:
                assert db.query("SHOW wal_level") == [("logical",)]
        finally:
            server.stop()
        assert not server.running and not (home / postgres.SERVER_DIR).exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)
