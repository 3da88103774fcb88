"""The live look: each view of a Snapshot as a small HTML/SVG fragment.

Cheap to build and to send over the widget comm several times a second (a PNG per refresh
would cost far more). Elements carry ``data-*`` attributes so a browser test can read them.
What the fragments say (labels, scales, captions) comes from ``model``, as in the static
picture: this module only places it.
"""
from __future__ import annotations

from html import escape

from labkit.widgets.model import (MARK_LETTER, NO_PRODUCERS, PRODUCER_HEAD, STATE_STYLE, Label,
                                  Snapshot, Track, cell_title, counter_values, labels_above,
                                  labels_below, offsets_scale, producer_rows, strip_caption,
                                  view_title)

FONT = "font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px;"
TRACK_W, PAD = 640, 16


def legend_html() -> str:
    items = "".join(
        f'<span style="margin-right:12px;white-space:nowrap" data-legend="{state}">'
        f'<span style="display:inline-block;width:11px;height:11px;background:{color};'
        f'vertical-align:-1px;margin-right:4px;border-radius:2px"></span>{label}</span>'
        for state, (label, color) in STATE_STYLE.items())
    return f'<div style="margin:4px 0;{FONT}">{items}</div>'


def strip_html(snap: Snapshot) -> str:
    """One square per offset, coloured by what it is; markers and duplicates lettered."""
    parts = [f'<div class="lk-strip" style="{FONT}"><b>{escape(view_title("log", snap.topic))}</b>',
             legend_html()]
    for track in snap.tracks:
        caption = strip_caption(snap, track.partition)
        name, _, span = caption.partition(" (")
        parts.append(f'<div style="margin-top:4px">{escape(name)} '
                     f'<span style="color:#777">({escape(span)}</span></div>'
                     '<div style="display:flex;flex-wrap:wrap;gap:2px;max-width:680px">')
        for c in snap.cells_of(track.partition):
            color = STATE_STYLE[c.state][1]
            parts.append(
                f'<div class="lk-cell" data-state="{c.state}" data-offset="{c.offset}" '
                f'title="{escape(cell_title(c))}" style="width:14px;height:14px;background:{color};'
                'color:white;font-size:9px;line-height:14px;text-align:center;border-radius:2px">'
                f'{MARK_LETTER.get(c.state, "")}</div>')
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def _label(x: float, y: float, label: Label, scale_end: int) -> str:
    anchor, dx = ("end", -3) if label.hangs_left(scale_end) else ("start", 3)
    return (f'<text x="{x + dx:.1f}" y="{y}" text-anchor="{anchor}" fill="{label.color}" '
            f'data-mark="{label.kind}" data-offset="{label.offset}">{escape(label.text)}</text>')


def _track_svg(t: Track, scale_end: int) -> str:
    def x(offset: int) -> float:
        return PAD + (TRACK_W - 2 * PAD) * offset / scale_end

    top = 20
    below = labels_below(t)
    height = top + 22 + 15 * len(below)
    svg = [f'<svg width="{TRACK_W}" height="{height}" viewBox="0 0 {TRACK_W} {height}" '
           f'data-partition="{t.partition}" style="{FONT}">',
           f'<rect x="{x(0):.1f}" y="{top}" width="{x(scale_end) - x(0):.1f}" height="12" fill="#eee"/>',
           f'<rect x="{x(t.log_start):.1f}" y="{top}" width="{x(t.lso) - x(t.log_start):.1f}" height="12" '
           f'fill="{STATE_STYLE["committed"][1]}"><title>readable by read_committed</title></rect>',
           f'<rect x="{x(t.lso):.1f}" y="{top}" width="{x(t.high_watermark) - x(t.lso):.1f}" height="12" '
           f'fill="{STATE_STYLE["open"][1]}"><title>held back by an open transaction</title></rect>']
    for label in labels_above(t):
        svg.append(f'<line x1="{x(label.offset):.1f}" x2="{x(label.offset):.1f}" y1="{top - 4}" '
                   f'y2="{top + 12}" stroke="#333"/>')
        svg.append(_label(x(label.offset), top - 6, label, scale_end))
    for i, label in enumerate(below):
        y = top + 26 + 15 * i
        svg.append(f'<line x1="{x(label.offset):.1f}" x2="{x(label.offset):.1f}" y1="{top}" '
                   f'y2="{y - 3}" stroke="{label.color}" stroke-dasharray="2,2"/>')
        svg.append(_label(x(label.offset), y, label, scale_end))
    svg.append("</svg>")
    return "".join(svg)


def offsets_html(snap: Snapshot) -> str:
    """Per partition: log start, LSO, high watermark, group offsets and the live position."""
    scale_end = offsets_scale(snap)
    rows = [f'<div style="{FONT};margin-top:6px"><b>{escape(view_title("offsets", snap.topic))}</b></div>']
    for t in snap.tracks:
        rows.append(f'<div style="{FONT};margin-top:2px">partition {t.partition}</div>'
                    + _track_svg(t, scale_end))
    return "".join(rows)


def counters_html(snap: Snapshot) -> str:
    boxes = []
    for name, value, color in counter_values(snap):
        boxes.append(
            f'<div class="lk-counter" data-counter="{name}" data-value="{value}" '
            'style="display:inline-block;min-width:92px;margin-right:8px;padding:6px 10px;'
            f'border:1px solid #ddd;border-radius:6px;{FONT}">'
            f'<div style="color:#777">{name}</div>'
            f'<div style="font-size:22px;font-weight:600;color:{color}">{value}</div></div>')
    return f'<div class="lk-counters">{"".join(boxes)}</div>'


def producers_html(snap: Snapshot) -> str:
    cell = "padding:2px 10px;text-align:right;border-bottom:1px solid #eee"
    rows = []
    for r, values in zip(snap.producers, producer_rows(snap)):
        style = ' style="background:#fff4dc"' if r.open_transaction else ""
        rows.append(f'<tr class="lk-producer" data-open="{int(r.open_transaction)}"{style}>'
                    + "".join(f'<td style="{cell}">{escape(v)}</td>' for v in values) + "</tr>")
    if not rows:
        rows.append(f'<tr><td colspan="{len(PRODUCER_HEAD)}" style="{cell};color:#777">'
                    f'{NO_PRODUCERS}</td></tr>')
    header = "".join(f'<th style="{cell};font-weight:600">{h}</th>' for h in PRODUCER_HEAD)
    return (f'<div style="{FONT};margin-top:8px"><b>{view_title("producers", snap.topic)}</b></div>'
            f'<table style="border-collapse:collapse;{FONT}"><tr>{header}</tr>{"".join(rows)}</table>')


VIEWS = {"counters": counters_html, "offsets": offsets_html, "log": strip_html,
         "producers": producers_html}
