"""A port the lab hands out is claimed for the process that asked while it lives: a broker
killed and not yet restarted keeps its port from every other lab on the machine."""
import subprocess
import sys

from labkit.kafka import ports

HAND_OUT = "from labkit.kafka import ports; print(ports.free_port(), flush=True); input()"


def test_a_port_another_living_process_was_handed_is_never_handed_again(monkeypatch):
    other = subprocess.Popen([sys.executable, "-c", HAND_OUT], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(other.stdout.readline())
        assert ports.port_is_free(port)  # nothing listens there (a broker killed, say)
        assert ports.claimed(port)
        # this process, drawing only that port, is refused it while the other lives
        monkeypatch.setattr(ports.random.Random, "randint", lambda self, a, b: port)
        assert ports.free_port() != port
    finally:
        other.stdin.close()
        other.wait(10)
    assert not ports.claimed(port)  # its claimant gone: the port can be handed out again
    assert ports.free_port() == port
