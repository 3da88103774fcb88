"""The live look: each view of a Snapshot as a small HTML/SVG fragment.

Cheap to build and to send over the widget comm several times a second (a PNG per refresh
would cost far more). Elements carry ``data-*`` attributes so a browser test can read them.
"""
from __future__ import annotations

from html import escape

from labkit.widgets.model import COUNTER_NAMES, STATE_STYLE, Snapshot, Track

FONT = "font-family: var(--jp-ui-font-family, sans-serif); font-size: 12px;"
MARK_LETTER = {"commit": "C", "abort": "A", "duplicate": "D"}
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
    parts = [f'<div class="lk-strip" style="{FONT}"><b>log of {escape(snap.topic)}</b>',
             legend_html()]
    for track in snap.tracks:
        cells = snap.cells_of(track.partition)
        span = f"offsets {cells[0].offset}–{cells[-1].offset}" if cells else "empty"
        parts.append(f'<div style="margin-top:4px">partition {track.partition} '
                     f'<span style="color:#777">({span})</span></div>'
                     '<div style="display:flex;flex-wrap:wrap;gap:2px;max-width:680px">')
        for c in cells:
            label, color = STATE_STYLE[c.state]
            title = f"offset {c.offset}: {label}" + (f", id {c.business_id}" if c.business_id is not None else "")
            parts.append(
                f'<div class="lk-cell" data-state="{c.state}" data-offset="{c.offset}" '
                f'title="{escape(title)}" style="width:14px;height:14px;background:{color};'
                'color:white;font-size:9px;line-height:14px;text-align:center;border-radius:2px">'
                f'{MARK_LETTER.get(c.state, "")}</div>')
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def _label(x: float, y: float, text: str, kind: str, offset: int, color: str = "#333") -> str:
    # Right-hand labels hang to the left of their tick so they stay inside the picture.
    anchor, dx = ("end", -3) if x > TRACK_W * 0.6 else ("start", 3)
    return (f'<text x="{x + dx:.1f}" y="{y}" text-anchor="{anchor}" fill="{color}" '
            f'data-mark="{kind}" data-offset="{offset}">{escape(text)}</text>')


def _track_svg(t: Track, scale_end: int) -> str:
    def x(offset: int) -> float:
        return PAD + (TRACK_W - 2 * PAD) * offset / scale_end

    top = 20
    lso_text = f"LSO {t.lso}" + (" = HW" if t.lso == t.high_watermark else " (open transaction)")
    below = [(lso_text, t.lso, "#333", "lso")]
    below += [(f"group {g} committed {o}", o, "#555", "group") for g, o in sorted(t.committed.items())]
    if t.position is not None:
        below.append((f"consumer position {t.position}", t.position, "#1f5fbf", "position"))
    height = top + 22 + 15 * len(below)
    svg = [f'<svg width="{TRACK_W}" height="{height}" viewBox="0 0 {TRACK_W} {height}" '
           f'data-partition="{t.partition}" style="{FONT}">',
           f'<rect x="{x(0):.1f}" y="{top}" width="{x(scale_end) - x(0):.1f}" height="12" fill="#eee"/>',
           f'<rect x="{x(t.log_start):.1f}" y="{top}" width="{x(t.lso) - x(t.log_start):.1f}" height="12" '
           f'fill="{STATE_STYLE["committed"][1]}"><title>readable by read_committed</title></rect>',
           f'<rect x="{x(t.lso):.1f}" y="{top}" width="{x(t.high_watermark) - x(t.lso):.1f}" height="12" '
           f'fill="{STATE_STYLE["open"][1]}"><title>held back by an open transaction</title></rect>']
    for offset in (t.log_start, t.high_watermark):
        svg.append(f'<line x1="{x(offset):.1f}" x2="{x(offset):.1f}" y1="{top - 4}" y2="{top + 12}" stroke="#333"/>')
    svg.append(_label(x(t.log_start), top - 6, f"log start {t.log_start}", "start", t.log_start))
    svg.append(_label(x(t.high_watermark), top - 6, f"high watermark {t.high_watermark}", "hw",
                      t.high_watermark))
    for i, (text, offset, color, kind) in enumerate(below):
        y = top + 26 + 15 * i
        svg.append(f'<line x1="{x(offset):.1f}" x2="{x(offset):.1f}" y1="{top}" y2="{y - 3}" '
                   f'stroke="{color}" stroke-dasharray="2,2"/>')
        svg.append(_label(x(offset), y, text, kind, offset, color))
    svg.append("</svg>")
    return "".join(svg)


def offsets_html(snap: Snapshot) -> str:
    """Per partition: log start, LSO, high watermark, group offsets and the live position."""
    ends = [v for t in snap.tracks
            for v in (t.high_watermark, t.position or 0, *t.committed.values())]
    scale_end = max([10, *ends]) + 1
    rows = [f'<div style="{FONT};margin-top:6px"><b>offsets of {escape(snap.topic)}</b></div>']
    for t in snap.tracks:
        rows.append(f'<div style="{FONT};margin-top:2px">partition {t.partition}</div>'
                    + _track_svg(t, scale_end))
    return "".join(rows)


def counters_html(snap: Snapshot) -> str:
    counts = snap.counts
    boxes = []
    for name in COUNTER_NAMES:
        value = getattr(counts, name) if counts else 0
        alarm = name in ("duplicated", "lost") and value > 0
        color = "#c0392b" if alarm else "#222"
        boxes.append(
            f'<div class="lk-counter" data-counter="{name}" data-value="{value}" '
            'style="display:inline-block;min-width:92px;margin-right:8px;padding:6px 10px;'
            f'border:1px solid #ddd;border-radius:6px;{FONT}">'
            f'<div style="color:#777">{name}</div>'
            f'<div style="font-size:22px;font-weight:600;color:{color}">{value}</div></div>')
    return f'<div class="lk-counters">{"".join(boxes)}</div>'


def producers_html(snap: Snapshot) -> str:
    head = ("partition", "producer id", "epoch", "last sequence", "transaction", "transactional id")
    cell = "padding:2px 10px;text-align:right;border-bottom:1px solid #eee"
    rows = []
    for r in snap.producers:
        txn = f"open since {r.txn_start_offset}" if r.open_transaction else "none"
        values = (r.partition, r.producer_id, r.producer_epoch, r.last_sequence, txn,
                  r.transactional_id or "")
        style = ' style="background:#fff4dc"' if r.open_transaction else ""
        rows.append(f'<tr class="lk-producer" data-open="{int(r.open_transaction)}"{style}>'
                    + "".join(f'<td style="{cell}">{escape(str(v))}</td>' for v in values) + "</tr>")
    if not rows:
        rows.append(f'<tr><td colspan="{len(head)}" style="{cell};color:#777">no producer state yet</td></tr>')
    header = "".join(f'<th style="{cell};font-weight:600">{h}</th>' for h in head)
    return (f'<div style="{FONT};margin-top:8px"><b>producer state (DescribeProducers)</b></div>'
            f'<table style="border-collapse:collapse;{FONT}"><tr>{header}</tr>{"".join(rows)}</table>')


VIEWS = {"counters": counters_html, "offsets": offsets_html, "log": strip_html,
         "producers": producers_html}
