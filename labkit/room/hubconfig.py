"""What runs inside the room's JupyterHub (``labkit.room.hub`` starts it): its settings, the
learners' login and the spawner that gives each learner a home, the notebooks and its
Kafka identity. Imported only by the hub's generated ``jupyterhub_config.py``:

    from labkit.room.hubconfig import configure
    configure(c, "<lab home>/room/room.json")

``room.json`` (written by ``labkit room serve``) says where everything is; nothing here
reads the instructor's environment, so the hub sees the room ``serve`` described.

Why the spawner runs every learner's server as the instructor's own user, one home
directory each (JupyterHub's ``SimpleLocalProcessSpawner``), and not one system user per
learner (``LocalProcessSpawner``): system users need the hub to run as root and the
instructor to create (and afterwards delete) 30 accounts on a laptop. The price, said in
docs/room.md: the *hub* keeps learners apart (it refuses anyone's URL but one's own), the
*broker* keeps their Kafka names apart (ACLs), but code a learner runs in a kernel could
read another's home directory. For a room that must be sealed, use system users or
Kubernetes.

Limits (``LearnerSpawner.limits``), set with ``setrlimit`` in the server's process before it
runs (inherited by its kernels and their JVMs, each on its own): RLIMIT_DATA bounds each
process's private writable memory (heap, anonymous mappings), not a learner's total; the
optional RLIMIT_NPROC counts every process and thread of the one system user all learners
share, so it is a room-wide ceiling against a fork bomb, not a share, and root ignores it.
A learner's total needs a cgroup per learner (Kubernetes, or ``systemd-run --user --scope``).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import resource
import shutil
import sys
from pathlib import Path

from jupyterhub.auth import Authenticator
from jupyterhub.spawner import SimpleLocalProcessSpawner
from jupyterhub.utils import url_path_join
from traitlets import Dict, Unicode

from labkit.room import learner_db

ADMIN = "instructor"  # the hub's admin: the board, the admin page; no server of its own

# The instructor's variables a learner's server keeps (where the lab's jars, Java and state
# are); the cluster, the credentials and the namespace are set per learner below instead.
KEEP_FROM_HUB = ("LABKIT_HOME", "LABKIT_CACHE", "LABKIT_PROJECT", "LABKIT_JAVA", "LABKIT_MVN",
                 "JAVA_HOME", "LABKIT_SPARK_REMOTE", "LABKIT_PG_DSN")
# Never copied into a learner's home: scratch files of the instructor's checkout.
NOT_COPIED = shutil.ignore_patterns("_*.ipynb", ".ipynb_checkpoints", "__pycache__")


class LearnerPasswords(Authenticator):
    """One password per learner, from the file ``labkit room serve`` generated (printed for
    the instructor). A wrong one gets the hub's own "Invalid username or password"."""

    passwords_file = Unicode(config=True, help="JSON {learner: password}, readable by the hub only")

    async def authenticate(self, handler, data: dict) -> str | None:
        passwords = json.loads(Path(self.passwords_file).read_text())
        name = (data.get("username") or "").strip().lower()
        expected = passwords.get(name)
        given = data.get("password") or ""
        if expected and hmac.compare_digest(expected.encode(), given.encode()):
            return name
        return None


class LearnerSpawner(SimpleLocalProcessSpawner):
    """A learner's JupyterLab: its own home (``home_dir_template``) with the lab's notebooks
    copied once (its edits survive restarts: never copied over), started with its
    namespace, the room's bootstrap and its own SCRAM credentials."""

    notebooks = Unicode(config=True, help="the project's notebooks/ folder, copied once")
    kafka = Dict(config=True, help="bootstrap, clients dir (learnerNN.properties), room name")
    keep = Dict(config=True, help="variables of the instructor's environment kept")
    limits = Dict(config=True, help="data_bytes, procs (0: none): setrlimit at spawn")
    pg_dsn = Unicode("", help="this learner's PostgreSQL DSN, made at each start")

    def _prepare_home(self) -> Path:
        home = Path(self.home_dir)
        home.mkdir(parents=True, exist_ok=True)
        target = home / "notebooks"
        if not target.exists():  # once: a learner's work is never overwritten
            shutil.copytree(self.notebooks, target, ignore=NOT_COPIED)
        # The room's passwords are new at every start of its cluster: copied at every spawn.
        own = home / ".labkit"
        own.mkdir(exist_ok=True)
        config = own / "kafka.properties"
        source = Path(self.kafka["clients"]) / f"{self.user.name}.properties"
        shutil.copyfile(source, config)
        config.chmod(0o600)
        return config

    def user_env(self, env: dict) -> dict:
        env = super().user_env(env)
        env.update(self.keep)
        env.update({
            "LABKIT_BOOTSTRAP": self.kafka["bootstrap"],
            "LABKIT_KAFKA_CONFIG": str(Path(self.home_dir) / ".labkit" / "kafka.properties"),
            # the SCRAM user's name, which the broker's prefixed ACLs allow (learner07.)
            "LABKIT_NAMESPACE": self.user.name,
        })
        if self.kafka.get("room"):
            env["LABKIT_ROOM"] = self.kafka["room"]
        if self.pg_dsn:
            env["LABKIT_PG_DSN"] = self.pg_dsn
        return env

    def make_preexec_fn(self, name: str):
        home_and_cwd = super().make_preexec_fn(name)
        wanted = [(resource.RLIMIT_DATA, int(self.limits.get("data_bytes") or 0)),
                  (resource.RLIMIT_NPROC, int(self.limits.get("procs") or 0))]

        def preexec() -> None:  # in the forked child, before exec: the server and all it starts
            home_and_cwd()
            for which, value in wanted:
                if value:
                    _, hard = resource.getrlimit(which)
                    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
                    resource.setrlimit(which, (value, value))

        return preexec

    def _make_pg(self) -> str:
        admin = learner_db.admin_dsn(self.keep.get("LABKIT_HOME"), self.keep.get("LABKIT_PG_DSN"))
        if admin is None:
            self.log.warning("no PostgreSQL for %s: the lessons that need one will say so",
                             self.user.name)
            return ""
        return learner_db.learner_dsn(admin, self.user.name)

    async def start(self):
        if self.user.name == ADMIN:
            raise RuntimeError(f"{ADMIN} has no server of its own: the board is at "
                               "/services/board/, the learners at /hub/admin")
        # files and SQL off the hub's event loop: other learners' logins go on meanwhile
        await asyncio.to_thread(self._prepare_home)
        self.pg_dsn = await asyncio.to_thread(self._make_pg)
        return await super().start()


def _landing(handler) -> str:
    """Where a login lands: the instructor on the board, a learner in its JupyterLab."""
    user = handler.current_user
    if user is not None and user.name == ADMIN:
        return url_path_join(handler.base_url, "services/board/")
    return ""  # the hub's own default: the learner's server, spawned if need be


def _services(c, room: dict, hub_dir: Path) -> None:
    """The board (admin only: the hub's OAuth) and the idle culler, both run by the hub in
    its directory (so ``labkit down`` finds whatever of them is left)."""
    board_env = {**room.get("keep", {}), "LABKIT_BOOTSTRAP": room["bootstrap"],
                 "LABKIT_KAFKA_CONFIG": room["admin_kafka"]}
    cull = room.get("cull", {})
    c.JupyterHub.services = [
        {"name": "board", "url": f"http://127.0.0.1:{room['board_port']}",
         "command": [sys.executable, "-m", "labkit.room.board_service", "--room", room["room"]],
         "environment": board_env, "cwd": str(hub_dir), "oauth_no_confirm": True,
         "display": False},
        {"name": "idle-culler", "cwd": str(hub_dir),
         # no Kafka, no database: the lab home only, where `labkit down` looks for the room
         "environment": {k: v for k, v in room.get("keep", {}).items() if k == "LABKIT_HOME"},
         "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                     f"--timeout={int(cull.get('timeout', 3600))}",
                     f"--cull-every={int(cull.get('every', 300))}"]},
    ]
    # the culler's scopes, as its README gives them for JupyterHub 2+
    c.JupyterHub.load_roles = [{"name": "idle-culler", "services": ["idle-culler"],
                                "scopes": ["list:users", "read:users:activity",
                                           "read:servers", "delete:servers"]}]


def configure(c, room_file: str | os.PathLike) -> None:
    """Fill JupyterHub's config ``c`` from ``room.json``."""
    room = json.loads(Path(room_file).read_text())
    hub_dir = Path(room["hub_dir"])
    c.JupyterHub.ip = room["host"]
    c.JupyterHub.port = room["port"]
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.hub_port = room["hub_port"]
    c.JupyterHub.db_url = f"sqlite:///{hub_dir / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(hub_dir / "cookie_secret")
    c.JupyterHub.pid_file = str(hub_dir / "jupyterhub.pid")
    c.JupyterHub.cleanup_servers = True  # the hub's stop stops every learner's server
    c.JupyterHub.cleanup_proxy = True
    c.ConfigurableHTTPProxy.command = [room["proxy"]]
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{room['proxy_api_port']}"
    c.ConfigurableHTTPProxy.pid_file = str(hub_dir / "proxy.pid")

    c.JupyterHub.authenticator_class = LearnerPasswords
    c.LearnerPasswords.passwords_file = room["passwords_file"]
    c.Authenticator.allowed_users = set(room["learners"])
    c.Authenticator.admin_users = {ADMIN}
    c.JupyterHub.default_url = _landing
    _services(c, room, hub_dir)
    # A learner's bad input, said on the hub's own pages: a second login, a server gone
    # (templates/: the proxy's 503 and the hub's "not running" say the files are kept).
    c.JupyterHub.template_paths = [str(Path(__file__).with_name("templates"))]
    c.JupyterHub.template_vars = {"announcement_login": (
        "Signed in on another browser already? Signing in here opens the same JupyterLab: "
        "the same files and running notebooks, nothing is lost. Two tabs editing one "
        "notebook: save in one, and JupyterLab asks the other which version to keep.")}

    c.JupyterHub.spawner_class = LearnerSpawner
    c.LearnerSpawner.home_dir_template = str(Path(room["homes"]) / "{username}")
    c.LearnerSpawner.notebooks = room["notebooks"]
    c.LearnerSpawner.kafka = {"bootstrap": room["bootstrap"], "clients": room["clients"],
                              "room": room.get("room", "")}
    c.LearnerSpawner.keep = room.get("keep", {})
    limits = room.get("limits", {})
    c.LearnerSpawner.limits = limits
    if limits.get("data_bytes"):
        c.Spawner.mem_limit = limits["data_bytes"]  # shown to the server as MEM_LIMIT too
    c.Spawner.cmd = room["singleuser"]
    c.Spawner.default_url = "/lab/tree/notebooks"
    c.Spawner.args = room.get("singleuser_args", [])
    # A 2-core machine starting several JupyterLabs at once: seconds each, not the default 30.
    c.Spawner.http_timeout = 120
    c.Spawner.start_timeout = 120
    # a killed server noticed in seconds, not the default 30: its learner's reload then gets
    # the hub's "not running" page with its Start button instead of the proxy's error
    c.Spawner.poll_interval = 5
