"""Network partitions between a failure lab's brokers, without root, iptables or Docker.

    with Network() as net:
        net.route({"controller-1": (front_port, controller_port)})  # 127.0.0.1 to 127.0.0.1
        net.cut("controller-1")      # broker 1 no longer reaches the controller
        net.heal()                   # every link passes bytes again

Each link is a plain TCP forwarder (a port the broker is told to use, forwarding to the
port the other side really listens on). A cut behaves like a partition, not like a dead
peer: the connections already open stop passing bytes in both directions (what is read is
held, and nothing more is read, so the sender's buffers fill), new connections are accepted
and never forwarded, and nobody gets a reset or a close. A partition that lasts for seconds
would end a real connection by timeouts on both sides, so ``heal`` closes the connections
held during the cut; the brokers connect again through the healed link.

All links run on one asyncio loop in a thread of its own; ``close`` (and leaving the
``with`` block, on every way out) closes every socket and ends the thread.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

HOST = "127.0.0.1"
CALL_TIMEOUT_S = 10.0
CHUNK = 64 * 1024


class _Pipe:
    """One connection through a link: the accepted side and the forwarded side."""

    def __init__(self, accepted: asyncio.StreamWriter):
        self.writers = [accepted]
        self.held = False  # cut: nothing more passes; closed at heal
        self.closed = asyncio.Event()

    def close(self) -> None:
        for w in self.writers:
            w.close()
        self.closed.set()


@dataclass
class Link:
    """A forwarder from ``listen_port`` to ``target_port``, both on 127.0.0.1."""

    name: str
    listen_port: int
    target_port: int
    cut: bool = False
    forwarded: int = 0  # connections forwarded so far
    held: int = 0  # connections accepted while cut, never forwarded
    pipes: set[_Pipe] = field(default_factory=set, repr=False)
    server: asyncio.AbstractServer | None = field(default=None, repr=False)


class Network:
    """The lab's links by name; ``cut`` and ``heal`` them from any thread."""

    def __init__(self) -> None:
        self.links: dict[str, Link] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- from the caller's thread -------------------------------------------
    def route(self, links: Mapping[str, tuple[int, int]]) -> None:
        """Start a forwarder per link (name -> (listen port, target port))."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever,
                                            name="partition-links", daemon=True)
            self._thread.start()
        for name, (listen, target) in links.items():
            link = Link(name, listen, target)
            self._call(self._listen(link))
            self.links[name] = link

    def cut(self, *names: str) -> None:
        """These links stop passing bytes, both ways, on old and new connections."""
        self._call(self._cut([self._link(n) for n in names]))

    def heal(self, *names: str) -> None:
        """These links (default: all) forward again; connections held by the cut are closed."""
        self._call(self._heal([self._link(n) for n in names] or list(self.links.values())))

    def is_cut(self, name: str) -> bool:
        return self._link(name).cut

    @property
    def ports(self) -> list[int]:
        """The ports the forwarders listen on."""
        return [link.listen_port for link in self.links.values()]

    def close(self) -> None:
        """Close every connection and listener and end the loop's thread (idempotent)."""
        loop, thread = self._loop, self._thread
        if loop is None:
            return
        self._loop = self._thread = None
        with contextlib.suppress(RuntimeError, TimeoutError):
            asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(CALL_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(CALL_TIMEOUT_S)
        loop.close()

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _link(self, name: str) -> Link:
        if name not in self.links:
            raise KeyError(f"no link {name!r}; links: {', '.join(self.links) or 'none'}")
        return self.links[name]

    def _call(self, coroutine) -> None:
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("the network is closed")
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CALL_TIMEOUT_S)

    # -- on the loop's thread -------------------------------------------------
    async def _listen(self, link: Link) -> None:
        link.server = await asyncio.start_server(
            lambda r, w: self._serve(link, r, w), HOST, link.listen_port, reuse_address=True)

    async def _cut(self, links: Iterable[Link]) -> None:
        for link in links:
            link.cut = True
            for pipe in link.pipes:
                pipe.held = True

    async def _heal(self, links: Iterable[Link]) -> None:
        for link in links:
            link.cut = False
            for pipe in [p for p in link.pipes if p.held]:
                pipe.close()

    async def _close_all(self) -> None:
        for link in self.links.values():
            if link.server is not None:
                link.server.close()
            for pipe in list(link.pipes):
                pipe.close()
        await asyncio.sleep(0.05)  # the pipes' tasks end and their sockets close

    async def _serve(self, link: Link, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        pipe = _Pipe(writer)
        link.pipes.add(pipe)
        try:
            if link.cut:  # accepted, never forwarded: the connecting side waits in vain
                pipe.held = True
                link.held += 1
                await pipe.closed.wait()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(HOST, link.target_port)
            except OSError:
                return  # nobody listens there (a killed broker): refused, as it would be
            pipe.writers.append(up_writer)
            link.forwarded += 1
            pumps = [asyncio.ensure_future(self._pump(pipe, reader, up_writer)),
                     asyncio.ensure_future(self._pump(pipe, up_reader, writer)),
                     asyncio.ensure_future(pipe.closed.wait())]
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for task in pumps:
                task.cancel()
        finally:
            link.pipes.discard(pipe)
            pipe.close()

    @staticmethod
    async def _pump(pipe: _Pipe, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        """Copy one direction until EOF; once the pipe is held, keep what was read (and read
        no more) until the pipe is closed at heal."""
        with contextlib.suppress(OSError):
            while True:
                data = await reader.read(CHUNK)
                if pipe.held:
                    await pipe.closed.wait()
                    return
                if not data:
                    return
                writer.write(data)
                await writer.drain()
