"""The room board: every learner's exercise results on one page the instructor projects.

With ``LABKIT_ROOM=<room>`` set, every exercise check (``labkit.exercises``) and every
``labkit scenario`` / ``labkit torture`` audit also publishes one small JSON record to the
room's topic on the shared cluster (``labkit.kafka.names.room_topic``): who (the learner's
namespace), which exercise, passed or the hint given, the audit's counts, when. A learner
whose record cannot be written (no permission on the topic, the cluster away) gets one
warning line; the lesson goes on.

``labkit room board`` reads that topic from its start and serves a page (127.0.0.1 by
default) with one row per learner and one column per exercise, refreshed every second: who
passed, who got a hint and how many times, and the room's audit totals.
"""
from __future__ import annotations

import getpass
import html
import json
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from labkit import settings
from labkit.kafka import names
from labkit.paths import project_root

PUBLISH_TIMEOUT_S = 3.0  # a check never waits longer than this for the board


def learner() -> str:
    """Who is publishing: the learner's namespace (a room gives each one), else the login."""
    return names.namespace() or getpass.getuser()


def publish(record: dict) -> bool:
    """Write ``record`` (plus learner and time) to the room's topic when LABKIT_ROOM is set.
    Never raises: a failure is one line on stderr. Returns whether it was written."""
    room = settings.current().room
    if not room:
        return False
    from confluent_kafka import KafkaException, Producer

    from labkit.kafka import cluster
    from labkit.kafka.clientlog import client_config

    record = {"learner": learner(), "t": round(time.time(), 3), **record}
    try:
        topic = names.room_topic(room)
        found = cluster.running()
        if found is None:
            raise RuntimeError("no cluster to publish to (set LABKIT_BOOTSTRAP to the room's)")
        errors: list[str] = []
        producer = Producer(client_config({"bootstrap.servers": found.bootstrap,
                                           "message.timeout.ms": int(PUBLISH_TIMEOUT_S * 1000)}))
        producer.produce(topic, key=record["learner"], value=json.dumps(record),
                         on_delivery=lambda err, _: errors.append(str(err)) if err else None)
        left = producer.flush(PUBLISH_TIMEOUT_S + 1)
        if errors or left:
            raise RuntimeError(errors[0] if errors else "not acknowledged in time")
    except (KafkaException, RuntimeError, settings.SettingsError) as exc:
        print(f"room board: your result was not published to room {room!r} ({exc}); "
              "the lesson goes on", file=sys.stderr)
        return False
    return True


def publish_verdict(notebook: str, exercise: str, passed: bool, message: str) -> bool:
    return publish({"kind": "exercise", "notebook": notebook, "exercise": exercise,
                    "passed": passed, "message": message[:300]})


def publish_audit(report) -> bool:
    """An audit's counts (``labkit scenario``, ``labkit torture``) for the room's totals."""
    return publish({"kind": "audit", "scenario": report.scenario, "guarantee": report.guarantee,
                    "produced": report.produced, "lost": report.lost,
                    "duplicated": report.duplicated, "exactly_once": report.exactly_once})


# ---------------------------------------------------------------- the board: state

def notebook_order() -> list[str]:
    tracks = tomllib.loads((project_root() / "notebooks" / "tracks.toml").read_text())
    return [n for t in tracks["track"] for n in t["notebooks"]]


@dataclass
class Cell:
    passed: bool = False  # ever passed
    hints: int = 0  # "Not yet" answers so far
    last: str = ""  # the last message
    t: float = 0.0


@dataclass
class RoomState:
    """What the room's records say so far: plain data, built one record at a time."""

    room: str
    cells: dict[str, dict[str, Cell]] = field(default_factory=dict)  # learner -> exercise -> cell
    audits: dict[str, int] = field(default_factory=lambda: {"runs": 0, "lost": 0, "duplicated": 0,
                                                            "exactly_once": 0})
    updated: float = 0.0

    def add(self, record: dict) -> None:
        self.updated = max(self.updated, float(record.get("t", 0)))
        if record.get("kind") == "audit":
            self.audits["runs"] += 1
            for key in ("lost", "duplicated"):
                self.audits[key] += int(record.get(key, 0))
            self.audits["exactly_once"] += bool(record.get("exactly_once"))
            self.cells.setdefault(record["learner"], {})
            return
        if record.get("kind") != "exercise":
            return
        key = exercise_key(record["notebook"], record.get("exercise", ""))
        cell = self.cells.setdefault(record["learner"], {}).setdefault(key, Cell())
        cell.passed = cell.passed or bool(record["passed"])
        cell.hints += not record["passed"]
        cell.last, cell.t = record.get("message", ""), float(record.get("t", 0))

    def exercises(self) -> list[str]:
        """The exercises anyone has tried, in the curriculum's order."""
        order = {n: i for i, n in enumerate(notebook_order())}
        seen = {k for row in self.cells.values() for k in row}
        return sorted(seen, key=lambda k: (order.get(k.split(" ")[0], len(order)), k))

    def to_json(self) -> dict:
        return {"room": self.room, "updated": self.updated, "audits": self.audits,
                "exercises": self.exercises(),
                "learners": {who: {k: vars(c) for k, c in row.items()}
                             for who, row in sorted(self.cells.items())}}


def exercise_key(notebook: str, exercise: str) -> str:
    return f"{notebook} {exercise}".strip()


# ---------------------------------------------------------------- the board: reading and serving

class RoomReader:
    """Reads the room's topic from its start into a RoomState, in a thread of its own."""

    def __init__(self, bootstrap: str, room: str):
        from confluent_kafka import Consumer, TopicPartition

        from labkit.kafka import topics
        from labkit.kafka.clientlog import client_config

        self.topic = names.room_topic(room)
        topics.create(bootstrap, self.topic, partitions=1)  # the instructor's: learners only write
        self.state, self.lock = RoomState(room), threading.Lock()
        self.consumer = Consumer(client_config({"bootstrap.servers": bootstrap,
                                                "group.id": names.group(f"labkit-board-{room}"),
                                                "enable.auto.commit": False}))
        self.consumer.assign([TopicPartition(self.topic, 0, 0)])  # from the start, every time
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="room-reader")
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            for message in self.consumer.consume(100, timeout=0.2):
                if message.error():
                    continue
                try:
                    record = json.loads(message.value())
                    with self.lock:
                        self.state.add(record)
                except (TypeError, ValueError, KeyError, AttributeError):
                    continue  # not the lab's record: skip it, keep the board up

    def snapshot(self) -> dict:
        with self.lock:
            return self.state.to_json()

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(5)
        self.consumer.close()


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>room __ROOM__</title>
<style>
body { font-family: sans-serif; margin: 1.5em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: center; }
th.learner, td.learner { text-align: left; }
td.passed { background: #d7f5d7; }
td.hint { background: #ffe2b8; }
td.stuck { background: #ffb3b3; font-weight: bold; }
#totals { margin: 0.8em 0; }
</style></head>
<body><h1>Room __ROOM__</h1>
<div id="totals">waiting for the first result ...</div>
<table id="board"></table>
<p>✅ passed · 🔁 n: hints so far, not passed yet (red: 3 or more) · refreshed every second</p>
<script>
const cell = (c) => !c ? ["", ""] : c.passed ? ["passed", "✅"]
  : [c.hints >= 3 ? "stuck" : "hint", "🔁 " + c.hints];
// behind JupyterHub (labkit.room.board_service) a script's request needs the hub's xsrf
// token, which the hub's OAuth leaves in the _xsrf cookie; the plain board has none
const xsrf = (document.cookie.match(/(?:^|;\\s*)_xsrf=([^;]*)/) || [])[1];
async function refresh() {
  const s = await (await fetch("state", {headers: xsrf ? {"X-XSRFToken": decodeURIComponent(xsrf)} : {}})).json();
  const head = "<tr><th class='learner'>learner</th>" +
    s.exercises.map(e => `<th>${e}</th>`).join("") + "</tr>";
  const rows = Object.entries(s.learners).map(([who, row]) =>
    `<tr data-learner="${who}"><td class="learner">${who}</td>` + s.exercises.map(e => {
      const [cls, text] = cell(row[e]);
      const tip = row[e] ? row[e].last.replace(/"/g, "&quot;") : "";
      return `<td class="${cls}" data-exercise="${e}" title="${tip}">${text}</td>`;
    }).join("") + "</tr>").join("");
  document.getElementById("board").innerHTML = head + rows;
  const a = s.audits;
  document.getElementById("totals").textContent =
    `${Object.keys(s.learners).length} learners · audits run: ${a.runs}, exactly once: ` +
    `${a.exactly_once}, records lost: ${a.lost}, duplicated: ${a.duplicated}`;
}
refresh(); setInterval(refresh, 1000);
</script></body></html>
"""


def serve(bootstrap: str, room: str, host: str = "127.0.0.1", port: int = 8770) -> None:
    """Serve room ``room``'s board until interrupted: the page at /, its data at /state."""
    reader = RoomReader(bootstrap, room)
    page = PAGE.replace("__ROOM__", html.escape(room)).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] == "/state":
                body, kind = json.dumps(reader.snapshot()).encode(), "application/json"
            elif self.path == "/":
                body, kind = page, "text/html; charset=utf-8"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # one request a second per screen: no log
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    print(f"room {room}: board at http://{host}:{server.server_address[1]}/ "
          f"(reading {reader.topic}); Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        reader.close()
