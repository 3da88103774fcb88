"""The static look: the same views drawn with matplotlib, for executed notebooks and docs
(nbval, nbconvert, a finished experiment) where no live widget front end runs.

Figures are built with the object API (no pyplot), so drawing never touches the notebook's
current figure or backend. What the figure says (labels, scales, captions) comes from
``model``, as in the live HTML view: this module only places it.
"""
from __future__ import annotations

import io
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from labkit.widgets.model import (COUNTER_NAMES, MARK_LETTER, NO_PRODUCERS, PRODUCER_HEAD,
                                  STATE_STYLE, Snapshot, counter_values, labels_above,
                                  labels_below, offsets_scale, producer_rows, strip_caption,
                                  view_title)

PER_ROW = 40  # log strip cells per row
WIDTH_IN = 9.0


def draw_counters(ax, snap: Snapshot) -> None:
    ax.set_axis_off()
    ax.set_xlim(0, len(COUNTER_NAMES))
    ax.set_ylim(0, 1)
    for i, (name, value, color) in enumerate(counter_values(snap)):
        ax.add_patch(Rectangle((i + 0.05, 0.05), 0.9, 0.9, facecolor="white", edgecolor="#ccc"))
        ax.text(i + 0.5, 0.7, name, ha="center", va="center", color="#777", fontsize=9)
        ax.text(i + 0.5, 0.35, str(value), ha="center", va="center", fontsize=16,
                fontweight="bold", color=color)


def _track_units(t) -> float:
    return 0.9 + 0.5 + 0.8 * len(labels_below(t)) + 0.3  # labels above, bar, labels below, gap


def _track_rows(snap: Snapshot) -> float:
    return sum(_track_units(t) for t in snap.tracks)


def draw_offsets(ax, snap: Snapshot) -> None:
    ax.set_axis_off()
    scale_end = offsets_scale(snap)
    ax.set_xlim(-0.1 * scale_end, scale_end * 1.02)
    ax.set_ylim(max(_track_rows(snap), 1), 0)
    ax.set_title(view_title("offsets", snap.topic), loc="left", fontsize=10)
    top = 0.0
    for t in snap.tracks:
        y = top + 0.9  # the bar
        ax.text(-0.02 * scale_end, y + 0.25, f"partition {t.partition}", fontsize=8, color="#555",
                va="center", ha="right")
        ax.add_patch(Rectangle((0, y), scale_end, 0.5, facecolor="#eee"))
        ax.add_patch(Rectangle((t.log_start, y), t.lso - t.log_start, 0.5,
                               facecolor=STATE_STYLE["committed"][1]))
        ax.add_patch(Rectangle((t.lso, y), t.high_watermark - t.lso, 0.5,
                               facecolor=STATE_STYLE["open"][1]))
        for label in labels_above(t):
            ax.text(label.offset, y - 0.15, label.text, fontsize=8, va="bottom", color=label.color,
                    ha="right" if label.hangs_left(scale_end) else "left")
        for i, label in enumerate(labels_below(t), start=1):
            ax.plot([label.offset, label.offset], [y + 0.5, y + 0.3 + i * 0.8], color=label.color,
                    lw=0.8, ls=":")
            ax.text(label.offset, y + 0.3 + i * 0.8, label.text, fontsize=8, color=label.color,
                    va="center", ha="right" if label.hangs_left(scale_end) else "left")
        top += _track_units(t)


def _strip_rows(snap: Snapshot) -> int:
    return sum(max(1, -(-len(snap.cells_of(t.partition)) // PER_ROW)) + 1 for t in snap.tracks)


def draw_strip(ax, snap: Snapshot) -> None:
    ax.set_axis_off()
    rows = max(_strip_rows(snap), 1)
    ax.set_xlim(-0.5, PER_ROW + 0.5)
    ax.set_ylim(rows + 0.2, -0.4)
    ax.set_aspect("equal")
    ax.set_title(view_title("log", snap.topic), loc="left", fontsize=10)
    y = 0
    for t in snap.tracks:
        cells = snap.cells_of(t.partition)
        ax.text(0, y + 0.3, strip_caption(snap, t.partition), fontsize=8, color="#555")
        y += 0.6
        for i, c in enumerate(cells):
            col, row = i % PER_ROW, y + i // PER_ROW
            ax.add_patch(Rectangle((col + 0.05, row + 0.05), 0.9, 0.9,
                                   facecolor=STATE_STYLE[c.state][1], gid=f"offset-{c.offset}"))
            if c.state in MARK_LETTER:
                ax.text(col + 0.5, row + 0.55, MARK_LETTER[c.state], ha="center", va="center",
                        fontsize=6, color="white", fontweight="bold")
        y += max(1, -(-len(cells) // PER_ROW)) + 0.4
    ax.legend(handles=[Patch(facecolor=color, label=label) for label, color in STATE_STYLE.values()],
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=6, fontsize=7, frameon=False)


def draw_producers(ax, snap: Snapshot) -> None:
    ax.set_axis_off()
    ax.set_title(view_title("producers", snap.topic), loc="left", fontsize=10)
    rows = [list(r) for r in producer_rows(snap)] or [["", NO_PRODUCERS, "", "", "", ""]]
    table = ax.table(cellText=rows, colLabels=list(PRODUCER_HEAD), loc="upper left",
                     cellLoc="right")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    for (row, _col), cell in table.get_celld().items():
        cell.set_edgecolor("#ddd")
        if row > 0 and snap.producers and snap.producers[row - 1].open_transaction:
            cell.set_facecolor("#fff4dc")


DRAW = {"counters": draw_counters, "offsets": draw_offsets, "log": draw_strip,
        "producers": draw_producers}


def _height(view: str, snap: Snapshot) -> float:
    if view == "counters":
        return 0.9
    if view == "offsets":
        return 0.4 + 0.2 * max(_track_rows(snap), 1)
    if view == "log":
        return 0.9 + 0.24 * max(_strip_rows(snap), 1)
    return 0.5 + 0.22 * (max(len(snap.producers), 1) + 1)


def figure(snap: Snapshot, views: tuple[str, ...] = tuple(DRAW)) -> Figure:
    """One figure with the given views stacked, top to bottom."""
    unknown = [v for v in views if v not in DRAW]
    if unknown or not views:
        raise ValueError(f"unknown view(s) {unknown}: choose from {list(DRAW)}")
    heights = [_height(v, snap) for v in views]
    # constrained layout makes room inside the figure for every title and label (the first
    # view's title sits above its axes) while the picture keeps its size
    fig = Figure(figsize=(WIDTH_IN, sum(heights)), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(views), 1, height_ratios=heights, squeeze=False)[:, 0]
    for view, ax in zip(views, axes):
        DRAW[view](ax, snap)
    fig.get_layout_engine().set(h_pad=0.04, hspace=0.08)
    return fig


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


class StaticPicture:
    """A finished view as a PNG. Displays as the image; its text form is stable (nbval)."""

    def __init__(self, png: bytes, title: str):
        self.png, self.title = png, title

    def _repr_png_(self) -> bytes:
        return self.png

    def __repr__(self) -> str:
        return f"<{self.title} (static picture)>"

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.png)
        return path
