"""A room served by JupyterHub: ``labkit room serve`` (``make room``) on the instructor's
machine starts the room's secure Kafka (one SCRAM user and prefixed ACLs per learner,
``labkit.room.secure_cluster``), the lab's PostgreSQL, and JupyterHub with its proxy; each
learner opens the hub's address in a browser, logs in with its name and password and gets a
JupyterLab of its own (``labkit.room.hubconfig``). ``labkit down`` stops all of it.

Where things are kept (in the lab home, ``LABKIT_HOME``, default ``.lab/``):

    room/kafka/        the cluster's CA, certificate and SCRAM users (new at each start)
    room/hub/          room.json, jupyterhub_config.py, the hub's database, log, passwords
    room/homes/NAME/   each learner's home: notebooks/ copied once, its work kept

The hub and everything it starts run detached, as ``labkit up``'s brokers do; ``hub.json``
in the lab home says where (pid and start time: a recycled pid is never signalled).
"""
from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from labkit import proc
from labkit.kafka import cluster as lab
from labkit.kafka.localcluster import LocalCluster
from labkit.kafka.ports import free_port
from labkit.kafka.reach import ClusterError
from labkit.paths import LabkitSetupError, lab_home, load_state, project_root, save_state
from labkit.room.secure_cluster import RoomFiles, RoomSecurity, learner_user
from labkit.storage import postgres

STATE_FILE = "hub.json"
PROXY_DIR = Path("scripts") / "room"  # package.json: configurable-http-proxy, pinned
HUB_MARKER = "jupyterhub"
READY_TIMEOUT_S = 90.0
DEFAULT_ROOM = "room"  # the board's topic when --room is not given: the hub always has one
# Per process of a learner's server (RLIMIT_DATA): a kernel with a Spark driver JVM stays
# under it (docs/room.md); 0 for none.
DEFAULT_MEM_LIMIT = 4 * 1024 ** 3
CULL_EVERY_S = 300


class HubError(RuntimeError):
    """The hub did not start or cannot; the message says what to do."""


@dataclass
class Room:
    url: str
    passwords: dict[str, str]  # learner -> its password (the instructor hands them out)
    bootstrap: str
    log: Path
    started_here: bool  # False: a hub already running was found

    def sheet(self) -> str:
        """What the instructor reads out or prints: the address, each name and password, and
        how the instructor's own terminal reaches the room's Kafka (the board, the doctor)."""
        admin = RoomFiles(self.log.parents[1] / "kafka", "").admin_file
        from labkit.room.hubconfig import ADMIN

        lines = [f"JupyterHub: {self.url}  (log: {self.log})",
                 f"the board: {self.url}/services/board/ (log in as {ADMIN}: "
                 f"{self.passwords.get(ADMIN, '?')}; learners are refused it)",
                 f"the room's Kafka, as its admin: export LABKIT_BOOTSTRAP={self.bootstrap} "
                 f"LABKIT_KAFKA_CONFIG={admin}",
                 "learner    password"]
        lines += [f"{name:<10} {password}" for name, password in self.passwords.items()
                  if name != ADMIN]
        return "\n".join(lines)


def parse_bytes(text: str) -> int:
    """``4G``, ``512M``, ``0`` (none) as bytes; a clear error otherwise."""
    units = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    value, unit = text.strip().upper()[:-1], text.strip().upper()[-1:]
    if unit.isdigit():
        value, unit = text.strip(), ""
    if unit not in units or not value.isdigit():
        raise HubError(f"--mem-limit {text!r}: give bytes with K, M or G, e.g. 4G (0: none)")
    return int(value) * units[unit]


def room_dir(home: Path | None = None) -> Path:
    return (Path(home) if home else lab_home()) / "room"


def proxy_command() -> Path:
    """The pinned configurable-http-proxy that ``make room`` installs with npm."""
    found = project_root() / PROXY_DIR / "node_modules" / ".bin" / "configurable-http-proxy"
    if not found.exists():
        raise LabkitSetupError(
            f"{found} is missing: run `make room` (it runs `npm ci --prefix {PROXY_DIR}`; "
            "needs Node.js 20+ and npm, on Debian/Ubuntu `apt-get install nodejs npm`)")
    return found


def check_jupyterhub() -> None:
    for module, name in (("jupyterhub", "JupyterHub"),
                         ("jupyterhub_idle_culler", "jupyterhub-idle-culler")):
        if importlib.util.find_spec(module) is None:
            raise LabkitSetupError(f"{name} is not installed in this environment: `make setup` "
                                   "installs it (or pip install -e '.[room]')")


def passwords(hub_dir: Path, names: list[str]) -> dict[str, str]:
    """Each learner's password: the ones made before are kept (a restarted hub: the sheet the
    instructor handed out stays valid), new learners get new ones. Readable by its owner only."""
    path = hub_dir / "passwords.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    # 8 characters from a 32-letter alphabet without 0/O/1/l: read out across a room
    alphabet = "abcdefghijkmnpqrstuvwxyz23456789"
    made = {n: known.get(n) or "".join(secrets.choice(alphabet) for _ in range(8)) for n in names}
    path.write_text(json.dumps(made, indent=2))
    path.chmod(0o600)
    return made


def running(home: Path | None = None) -> dict | None:
    """The running hub's state (pid, url, ...), or None."""
    _, state = load_state(home, STATE_FILE)
    if state is None or proc.ours(state["pid"], state["create_time"], HUB_MARKER) is None:
        return None
    return state


def serve(learners: int = 3, host: str = "127.0.0.1", port: int = 8000, brokers: int = 1,
          room: str = "", mem_limit: int = DEFAULT_MEM_LIMIT, max_procs: int = 0,
          cull_idle_s: int = 3600) -> Room:
    """Start the room (cluster, PostgreSQL, hub) or find the one running; its sheet.
    ``mem_limit`` bytes per process of a learner's server, ``max_procs`` the one system
    user's processes and threads (room-wide: hubconfig says why), ``cull_idle_s`` how long
    a learner's server may sit idle before the culler stops it (its files stay)."""
    if not 1 <= learners <= 99:
        raise HubError(f"--learners must be 1-99, not {learners}")
    if cull_idle_s < 60:
        raise HubError(f"--cull-idle must be 60 s or more, not {cull_idle_s}")
    room = room or DEFAULT_ROOM
    check_jupyterhub()
    from labkit.room.hubconfig import ADMIN  # imports JupyterHub: once it is known there
    proxy = proxy_command()
    base = room_dir()
    hub_dir, homes, kafka_dir = base / "hub", base / "homes", base / "kafka"
    names = [learner_user(i) for i in range(1, learners + 1)]
    found = running()
    if found is not None:
        if learners > len(found["learners"]):
            raise HubError(f"the room running has {len(found['learners'])} learners, not "
                           f"{learners}: `labkit down` first to serve a bigger one")
        return Room(found["url"], passwords(hub_dir, [ADMIN, *names]), found["bootstrap"],
                    Path(found["log"]), started_here=False)
    _check_port_free(host, port)
    for d in (hub_dir, homes):
        d.mkdir(parents=True, exist_ok=True)
    cluster, started = _room_cluster(kafka_dir, learners, brokers)
    try:
        if started:
            _start_postgres()
        sheet = passwords(hub_dir, [ADMIN, *names])
        config = _write_config(hub_dir, homes, kafka_dir, proxy, host, port, names,
                               cluster.bootstrap, room,
                               limits={"data_bytes": mem_limit, "procs": max_procs},
                               cull={"timeout": cull_idle_s,
                                     "every": min(CULL_EVERY_S, max(10, cull_idle_s // 4))})
        url = f"http://{host}:{port}"
        log = hub_dir / "hub.log"
        _start_hub(config, hub_dir, log, url, cluster.bootstrap, names)
    except BaseException:
        stop()
        if started:  # what this call started goes with it; a room found running stays
            cluster.stop()
            postgres.stop()
        raise
    return Room(url, sheet, cluster.bootstrap, log, started_here=True)


def _check_port_free(host: str, port: int) -> None:
    with socket.socket() as s:
        # as the proxy (Node) binds: a hub stopped a moment ago leaves TIME_WAIT, not a taker
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise HubError(f"{host}:{port} is taken ({exc.strerror}): --port N serves the hub "
                           "on another port") from None


def _room_cluster(kafka_dir: Path, learners: int, brokers: int) -> tuple[LocalCluster, bool]:
    """The room's secure cluster in the lab home: the one running (a hub restarted), or a
    new one with a SCRAM user and prefixed ACLs per learner. A plain ``labkit up`` lab is
    refused: its single learner user is not the room's."""
    with lab.start_lock():
        running_lab = LocalCluster.attach()
        if running_lab is not None:
            files = RoomFiles(kafka_dir, str(kafka_dir))
            if not running_lab.secure or not files.clients_dir.exists():
                raise HubError("a lab started by `labkit up` is running: the room needs its "
                               "own secure cluster; `labkit down` first, then serve the room")
            if len(files.learners()) < learners:
                raise HubError(f"the room's cluster has users for {len(files.learners())} "
                               f"learners, not {learners}: `labkit down` first")
            return running_lab, False
        cluster = LocalCluster(brokers=brokers, detached=True, secure=True)
        cluster.security = RoomSecurity(kafka_dir, learners)
        return cluster.start(), True


def _start_postgres() -> None:
    """The lab's PostgreSQL, as ``labkit up`` starts it; a note, not a failure, without it."""
    try:
        with postgres.start_lock():
            postgres.LabPostgres.attach() or postgres.LabPostgres(detached=True).start()
    except (postgres.PostgresError, LabkitSetupError) as exc:
        print(f"note: the lab's PostgreSQL did not start ({exc}); the lessons that need it "
              "will say so", file=sys.stderr)


def _write_config(hub_dir: Path, homes: Path, kafka_dir: Path, proxy: Path, host: str,
                  port: int, names: list[str], bootstrap: str, room: str, limits: dict,
                  cull: dict) -> Path:
    from labkit.room import hubconfig

    keep = {k: v for k in hubconfig.KEEP_FROM_HUB if (v := os.environ.get(k))}
    keep.setdefault("LABKIT_HOME", str(lab_home()))  # the lab's PostgreSQL is found there
    keep.setdefault("LABKIT_PROJECT", str(project_root()))
    room_file = hub_dir / "room.json"
    room_file.write_text(json.dumps({
        "host": host, "port": port, "hub_port": free_port(), "proxy_api_port": free_port(),
        "hub_dir": str(hub_dir), "homes": str(homes), "proxy": str(proxy),
        "passwords_file": str(hub_dir / "passwords.json"), "learners": names,
        "notebooks": str(project_root() / "notebooks"), "bootstrap": bootstrap,
        "clients": str(RoomFiles(kafka_dir, str(kafka_dir)).clients_dir), "room": room,
        "admin_kafka": str(RoomFiles(kafka_dir, str(kafka_dir)).admin_file),
        "board_port": free_port(), "limits": limits, "cull": cull,
        "keep": keep, "singleuser": [sys.executable, "-m", "jupyterhub.singleuser"],
        # Jupyter refuses to run as root unless told to (containers, CI-like machines)
        "singleuser_args": ["--allow-root"] if os.geteuid() == 0 else [],
    }, indent=2))
    config = hub_dir / "jupyterhub_config.py"
    config.write_text("# written by `labkit room serve` (labkit.room.hub); rewritten at each start\n"
                      "from labkit.room.hubconfig import configure\n\n"
                      f"configure(c, {str(room_file)!r})\n")
    return config


def _start_hub(config: Path, hub_dir: Path, log: Path, url: str, bootstrap: str,
               names: list[str]) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LABKIT_BOOTSTRAP", "LABKIT_KAFKA_CONFIG", "LABKIT_NAMESPACE")}
    # the proxy is a Node script (#!/usr/bin/env node): the hub finds node on its PATH
    with log.open("a") as out:
        hub = proc.spawn([sys.executable, "-m", "jupyterhub", "-f", str(config)], owned=False,
                         group=True, cwd=hub_dir, env=env, stdout=out,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    save_state(lab_home(), STATE_FILE, {
        "pid": hub.pid, "create_time": proc.create_time(hub.pid), "url": url, "log": str(log),
        "bootstrap": bootstrap, "learners": names, "room_dir": str(room_dir())})
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            urllib.request.urlopen(f"{url}/hub/api", timeout=2).read()
            return
        except OSError:
            if hub.poll() is not None or time.monotonic() > deadline:
                why = "exited" if hub.poll() is not None else f"did not answer in {READY_TIMEOUT_S:.0f} s"
                raise HubError(f"JupyterHub {why}; its log {log} ends with:\n{_tail(log)}") from None
            time.sleep(0.3)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(home: Path | None = None) -> bool:
    """Stop the hub, its proxy, every learner's server and kernels; False if none ran.

    The hub's own SIGTERM stops its learners' servers and its proxy (cleanup_servers,
    cleanup_proxy); whatever of its process tree is left gets SIGKILL. Then anything still
    running in the room's directories (a server a crashed hub left behind) is stopped too."""
    home, state = load_state(home, STATE_FILE)
    hub = proc.ours(state["pid"], state["create_time"], HUB_MARKER) if state else None
    if hub is not None:
        proc.shut_down(hub, signal.SIGTERM, timeout_s=30)
    base = Path(state["room_dir"]) if state else room_dir(home)
    left = _running_in(base / "hub", base / "homes")
    if left:
        proc.stop(left, timeout_s=10)
    (home / STATE_FILE).unlink(missing_ok=True)
    return hub is not None or bool(left)


def _running_in(*dirs: Path) -> list[psutil.Process]:
    """Processes whose working directory is inside ``dirs`` (the proxy runs in the hub's,
    a learner's server and kernels in its home), except this one."""
    roots = [str(d.resolve()) for d in dirs]
    found = []
    for p in psutil.process_iter(["cwd"]):
        cwd = p.info.get("cwd")
        if p.pid != os.getpid() and cwd and any(cwd == r or cwd.startswith(r + os.sep) for r in roots):
            found.append(p)
    return found


def remove_kafka_files(home: Path | None = None) -> None:
    """The room cluster's CA, broker key and passwords: made anew at its next start."""
    shutil.rmtree(room_dir(home) / "kafka", ignore_errors=True)
