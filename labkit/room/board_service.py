"""The room's board as a JupyterHub service: the hub starts it (``labkit.room.hubconfig``),
its proxy serves it at ``/services/board/``, and the hub's OAuth lets in only those whose
token carries ``access:services!service=board``: the hub's admin (the instructor; the
admin role has ``access:services``), not a learner (the default ``user`` role has
``self`` only), who gets 403.

    python -m labkit.room.board_service --room NAME

Run by the hub with the room's Kafka admin in its environment (LABKIT_BOOTSTRAP,
LABKIT_KAFKA_CONFIG) and JupyterHub's own variables (JUPYTERHUB_SERVICE_URL: where to
listen, JUPYTERHUB_SERVICE_PREFIX, JUPYTERHUB_API_TOKEN ...). The page and its data are
``labkit.room.board``'s; ``labkit room board`` still serves them without a hub.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import secrets
import signal
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import ioloop, web

from labkit.kafka import cluster
from labkit.room.board import PAGE, RoomReader


class BoardPage(HubOAuthenticated, web.RequestHandler):
    """The board's page and its /state, for a hub user allowed this service's scope."""

    def initialize(self, reader: RoomReader, page: bytes) -> None:
        self.reader, self.page = reader, page

    @web.authenticated
    def get(self, what: str | None = None) -> None:  # None: the page (the group unmatched)
        self.set_header("Cache-Control", "no-store")
        if what == "state":
            self.set_header("Content-Type", "application/json")
            self.write(json.dumps(self.reader.snapshot()))
        elif not what:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.write(self.page)
        else:
            raise web.HTTPError(404)


def make_app(reader: RoomReader, room: str, prefix: str) -> web.Application:
    page = PAGE.replace("__ROOM__", html.escape(room)).encode()
    return web.Application([
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        (prefix + r"(state)?", BoardPage, {"reader": reader, "page": page}),
    ], cookie_secret=secrets.token_bytes(32))  # a restarted board asks the hub again: fine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m labkit.room.board_service")
    parser.add_argument("--room", required=True)
    args = parser.parse_args(argv)
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/board/")
    reader = RoomReader(cluster.running_or_fail().bootstrap, args.room)
    server = make_app(reader, args.room, prefix).listen(url.port, url.hostname or "127.0.0.1")
    loop = ioloop.IOLoop.current()
    # the hub stops its services with SIGTERM: close the consumer, then end
    loop.asyncio_loop.add_signal_handler(signal.SIGTERM, loop.stop)
    print(f"room {args.room}: board at {prefix} (reading {reader.topic})", flush=True)
    try:
        loop.start()
    finally:
        server.stop()
        reader.close()


if __name__ == "__main__":
    main()
