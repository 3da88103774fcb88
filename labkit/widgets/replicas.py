"""The replica board: one partition's brokers while a failure experiment runs. Who leads,
who is in the ISR (or is an eligible leader replica), and whether each broker's process
runs, is frozen or is down; under it, every change seen so far.

    board = ReplicaBoard()
    experiments.run("leader-failover", cluster=lab, acks="1", watch=board)  # redrawn live

It redraws one HTML output in place (``display_id``), so the saved notebook keeps the last
picture, history included, with no widget state to lose.
"""
from __future__ import annotations

import threading
from html import escape

from labkit.kafka.inspect import ReplicaMoment

FONT = "font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px;"
# what a replica is to the partition -> (label, colour)
SYNC_STYLE = {"isr": ("in the ISR", "#4c9f70"), "elr": ("eligible (ELR)", "#1f5fbf"),
              "out": ("out of sync", "#999999")}
# what its process is doing -> (label, colour)
PROCESS_STYLE = {"running": ("running", "#4c9f70"), "frozen": ("frozen (SIGSTOP)", "#3b8fd9"),
                 "down": ("down (killed)", "#c0392b")}


def replica_roles(moment: ReplicaMoment) -> list[tuple[int, str, str, str]]:
    """(broker, role, sync, process) per broker: role leader|follower, sync isr|elr|out."""
    state = moment.state
    brokers = state.replicas if state is not None else tuple(sorted(moment.processes))
    rows = []
    for b in brokers:
        role = "leader" if state is not None and state.leader == b else "follower"
        sync = ("isr" if state is not None and b in state.isr else
                "elr" if state is not None and b in state.elr else "out")
        rows.append((b, role, sync, moment.processes.get(b, "down")))
    return rows


def _box(broker: int, role: str, sync: str, process: str) -> str:
    sync_label, sync_colour = SYNC_STYLE[sync]
    process_label, process_colour = PROCESS_STYLE[process]
    border = "3px solid #222" if role == "leader" else "1px solid #ccc"
    return (f'<div class="lk-replica" data-broker="{broker}" data-role="{role}" '
            f'data-sync="{sync}" data-process="{process}" style="display:inline-block;'
            f'min-width:120px;margin-right:8px;padding:6px 10px;border:{border};'
            f'border-radius:6px;vertical-align:top">'
            f'<div style="font-weight:600">broker {broker}{" · leader" if role == "leader" else ""}</div>'
            f'<div style="color:{sync_colour}">{sync_label}</div>'
            f'<div style="color:{process_colour}">{process_label}</div></div>')


def board_html(history: list[ReplicaMoment], title: str = "replicas") -> str:
    """The latest moment as boxes, then one row per change seen."""
    now = history[-1]
    boxes = "".join(_box(*row) for row in replica_roles(now))
    cell = "padding:1px 8px;border-bottom:1px solid #eee;text-align:left"
    rows = "".join(
        f'<tr class="lk-replica-change"><td style="{cell};text-align:right">{m.seconds:.1f} s</td>'
        f'<td style="{cell}">{escape(m.state_text())}</td>'
        f'<td style="{cell}">{escape(m.processes_text())}</td>'
        f'<td style="{cell};color:#777">{escape(m.step)}</td></tr>' for m in history)
    head = "".join(f'<th style="{cell};font-weight:600">{h}</th>'
                   for h in ("time", "partition (as a running broker sees it)",
                             "broker processes", "after the step"))
    return (f'<div class="lk-replica-board" style="{FONT}"><b>{escape(title)}</b> '
            f'<span style="color:#777">{now.seconds:.1f} s: {escape(now.step)}</span>'
            f'<div style="margin:6px 0">{boxes}</div>'
            f'<table style="border-collapse:collapse;{FONT}"><tr>{head}</tr>{rows}</table></div>')


class ReplicaBoard:
    """Pass as ``watch=`` to a failure experiment: shows each moment it is handed (from the
    experiment's watcher thread), keeping the history of changes."""

    def __init__(self, title: str = "replicas of the partition"):
        self.title = title
        self.history: list[ReplicaMoment] = []
        self._handle = None
        self._lock = threading.Lock()

    def __call__(self, moment: ReplicaMoment) -> None:
        from IPython.display import HTML, display

        with self._lock:
            self.history.append(moment)
            picture = HTML(board_html(self.history, self.title))
            if self._handle is None:
                self._handle = display(picture, display_id=True)
            else:
                self._handle.update(picture)
