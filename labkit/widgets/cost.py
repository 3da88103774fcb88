"""Notebook 09's pictures, drawn from the cost benchmark's tables (``labkit.cost.findings``): every round as a dot,
the median as a bar, the spread as a whisker; the published figures as marks beside the
measured grid. Each returns a ``StaticPicture`` (its text form is stable for nbval)."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from labkit.cost.published import PUBLISHED, Published
from labkit.widgets.static import StaticPicture, png_bytes

BAR, DOT, MARK = "#9ecae1", "#08519c", "#d62728"


def guarantees_picture(runs: pd.DataFrame, title: str = "cost of each guarantee") -> StaticPicture:
    """Left: throughput of every round per guarantee (dots), median (bar) and the range of
    the rounds. Right: p50 latency of every paced round (dots) and its median (bar)."""
    fast, paced = runs[runs["mode"] == "throughput"], runs[runs["mode"] == "latency"]
    order = list(dict.fromkeys(runs["guarantee"]))
    fig = Figure(figsize=(11, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    for ax, frame, column, label in ((ax1, fast, "records_per_s", "records/s"),
                                     (ax2, paced, "latency_p50_ms", "p50 ms, produce() to consumer")):
        for i, g in enumerate(order):
            values = frame.loc[frame["guarantee"] == g, column]
            if values.empty:
                continue
            ax.bar(i, values.median(), color=BAR, width=0.6)
            ax.vlines(i, values.min(), values.max(), color="grey", linewidth=1)
            ax.plot([i] * len(values), values, "o", color=DOT, markersize=4, alpha=0.8)
        ax.set_xticks(range(len(order)), order, rotation=15)
        ax.set_ylabel(label)
    size = int(fast["value_bytes"].iloc[0]) if not fast.empty else 0
    ax1.set_title(f"throughput, {size} B records: each dot one round, bar the median", fontsize=9)
    rate = paced["rate"].iloc[0] if not paced.empty else 0
    ax2.set_title(f"latency at {rate:,.0f} records/s: each dot one round", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return StaticPicture(png_bytes(fig), title)


def grid_picture(grid_table: pd.DataFrame, published: tuple[Published, ...] = PUBLISHED,
                 title: str = "transactions vs at_least_once") -> StaticPicture:
    """Throughput change vs the same round's at_least_once run per record size and commit
    interval: median (bar), middle half of the rounds (thick whisker), range (thin whisker);
    the published figures measured against at-least-once as red marks at their setting."""
    cells = grid_table.drop(index="at_least_once", level="config")
    labels = [f"{size} B\n{config.split('@')[1]}" for size, config in cells.index]
    fig = Figure(figsize=(9, 3.8))
    ax = fig.subplots()
    for i, (_, row) in enumerate(cells.iterrows()):
        ax.bar(i, row["throughput_vs_baseline_pct"], color=BAR, width=0.6)
        ax.vlines(i, row["vs_baseline_pct_min"], row["vs_baseline_pct_max"], color="grey", linewidth=1)
        ax.vlines(i, row["vs_baseline_pct_q1"], row["vs_baseline_pct_q3"], color=DOT, linewidth=4)
    for pub in published:
        if pub.baseline != "at_least_once":
            continue
        for i, (size, config) in enumerate(cells.index):
            same_interval = config == f"transactional@{pub.commit_interval_ms:g}ms"
            if same_interval and pub.value_bytes in (None, size):
                ax.plot([i + 0.35] * 2, [pub.low_pct, pub.high_pct], "_-", color=MARK,
                        markersize=14, linewidth=2)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("% throughput vs at_least_once")
    ax.set_title("bar: median of the paired rounds; blue: middle half; grey: range; "
                 "red: published", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return StaticPicture(png_bytes(fig), title)
