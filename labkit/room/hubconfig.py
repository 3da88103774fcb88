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
"""
from __future__ import annotations

import hmac
import json
import os
import shutil
from pathlib import Path

from jupyterhub.auth import Authenticator
from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Dict, Unicode

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
        return env

    async def start(self):
        self._prepare_home()
        return await super().start()


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

    c.JupyterHub.spawner_class = LearnerSpawner
    c.LearnerSpawner.home_dir_template = str(Path(room["homes"]) / "{username}")
    c.LearnerSpawner.notebooks = room["notebooks"]
    c.LearnerSpawner.kafka = {"bootstrap": room["bootstrap"], "clients": room["clients"],
                              "room": room.get("room", "")}
    c.LearnerSpawner.keep = room.get("keep", {})
    c.Spawner.cmd = room["singleuser"]
    c.Spawner.default_url = "/lab/tree/notebooks"
    c.Spawner.args = room.get("singleuser_args", [])
    # A 2-core machine starting several JupyterLabs at once: seconds each, not the default 30.
    c.Spawner.http_timeout = 120
    c.Spawner.start_timeout = 120
