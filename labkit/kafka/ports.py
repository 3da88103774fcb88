"""Ports for the lab's brokers: a free one, in a range no client or port-0 listener is given."""
from __future__ import annotations

import os
import random
import socket
import tempfile
from pathlib import Path

import psutil

from labkit.kafka.reach import ClusterError


class PortInUseError(ClusterError):
    """The port asked for (``labkit up --port``) is taken by another process."""


# Brokers take ports below Linux's ephemeral range (32768-60999 by default): a port there is
# never handed to a client connection as its source port or to a port-0 listener (a proxy,
# JupyterLab), so a broker killed and restarted finds its port still free.
BROKER_PORT_RANGE = (20000, 32000)
# ... but a broker killed and not yet restarted leaves its port free for a moment, and
# another lab on this machine (a test beside it, a PostgreSQL, a hub) could pick it: the
# restart then fails ("Unable to start acceptor", seen with failure labs beside the room's
# tests). Each port handed out is claimed for the process that asked while it lives, and
# no process is handed a claimed one.
CLAIMS = Path(tempfile.gettempdir()) / f"labkit-ports-{os.getuid()}"


def free_port() -> int:
    """A free port in the brokers' range, claimed for this process (see CLAIMS)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(*BROKER_PORT_RANGE)
        if port_is_free(port) and _claim(port):
            return port
    with socket.socket() as s:  # that whole range busy: any free port will do
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def claimed(port: int) -> bool:
    """Whether a living process was handed ``port`` (this one too)."""
    try:
        pid = int((CLAIMS / str(port)).read_text())
    except (OSError, ValueError):
        return False
    return psutil.pid_exists(pid)


def _claim(port: int) -> bool:
    """``port`` claimed for this process, unless a living one holds it already."""
    if claimed(port):
        return False
    CLAIMS.mkdir(exist_ok=True)
    (CLAIMS / str(port)).write_text(str(os.getpid()))
    return True
