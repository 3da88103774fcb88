"""Ports for the lab's brokers: a free one, in a range no client or port-0 listener is given."""
from __future__ import annotations

import random
import socket

from labkit.kafka.reach import ClusterError


class PortInUseError(ClusterError):
    """The port asked for (``labkit up --port``) is taken by another process."""


# Brokers take ports below Linux's ephemeral range (32768-60999 by default): a port there is
# never handed to a client connection as its source port or to a port-0 listener (a proxy,
# JupyterLab), so a broker killed and restarted finds its port still free.
BROKER_PORT_RANGE = (20000, 32000)


def free_port() -> int:
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(*BROKER_PORT_RANGE)
        if port_is_free(port):
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
