"""labkit.faults.partition on plain sockets (no broker): a cut link behaves like a network
partition (nothing passes either way, new connections are accepted and hang, nobody is reset
or closed), a heal closes what the cut held and forwards again, and close leaves nothing."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from labkit.faults.partition import Network
from labkit.kafka.ports import free_port


@pytest.fixture
def server():
    """A TCP server that keeps what it accepts."""
    srv = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1], accepted
    srv.close()
    for s in accepted:
        s.close()


def silent(s: socket.socket, wait_s: float = 0.5) -> bool:
    """Nothing arrives (not data, not a close, not a reset) within wait_s."""
    s.settimeout(wait_s)
    try:
        s.recv(10)
    except socket.timeout:
        return True
    return False


def test_a_cut_link_passes_nothing_and_hangs_new_connections_until_healed(server):
    target, accepted = server
    front = free_port()
    with Network() as net:
        net.route({"a": (front, target)})
        client = socket.create_connection(("127.0.0.1", front), timeout=2)
        client.sendall(b"hello")
        accepted_side = _wait_for(accepted, 1)
        accepted_side.settimeout(2)
        assert accepted_side.recv(10) == b"hello"

        net.cut("a")
        client.sendall(b"lost")
        accepted_side.sendall(b"lost too")
        assert silent(accepted_side) and silent(client)  # neither way, and no reset
        late = socket.create_connection(("127.0.0.1", front), timeout=2)  # accepted...
        assert silent(late) and len(accepted) == 1  # ... and never forwarded

        net.heal()
        client.settimeout(2)
        assert client.recv(10) == b""  # held by the cut: closed at the heal
        again = socket.create_connection(("127.0.0.1", front), timeout=2)
        again.sendall(b"back")
        forwarded = _wait_for(accepted, 2)
        forwarded.settimeout(2)
        assert forwarded.recv(10) == b"back"
        for s in (client, late, again):
            s.close()
    with socket.socket() as probe:  # closed: the port refuses, the loop's thread is gone
        assert probe.connect_ex(("127.0.0.1", front)) != 0
    assert not [t for t in threading.enumerate() if t.name == "partition-links"]


def _wait_for(accepted: list[socket.socket], n: int) -> socket.socket:
    for _ in range(50):
        if len(accepted) >= n:
            return accepted[n - 1]
        time.sleep(0.05)
    raise AssertionError(f"the server accepted {len(accepted)} connections, not {n}")
