"""08e's picture: every output record of a Spark copy query killed mid-batch, by when it was
written (seconds from the kill) and how long after its payment it came (its delay); a
payment's second copy in red. Returns a ``StaticPicture`` (its text form is stable for nbval)."""
from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure

from labkit.checking.record import RunRecord
from labkit.widgets.static import StaticPicture, png_bytes

FIRST, AGAIN = "#08519c", "#d62728"


def copies_picture(runs: Mapping[str, RunRecord],
                   title: str = "each output record: when written, how late") -> StaticPicture:
    """One panel per run (its label above it), x: seconds from the kill, y: delay in ms (log
    scale); first copies blue, copies written again red, the kill a dashed line."""
    fig = Figure(figsize=(11, 3.6))
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    for ax, (label, run) in zip(axes, runs.items()):
        out = run.output
        at = (out["created_ms"] - run.killed_ms) / 1000
        delay = out["delay_ms"].clip(lower=1)  # the log scale: under 1 ms drawn at 1
        for again, colour, name in ((False, FIRST, "first copy"), (True, AGAIN, "written again")):
            picked = (out["copy"] > 1) == again
            ax.plot(at[picked], delay[picked], ".", color=colour, markersize=3, label=name)
        ax.axvline(0, color="black", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("seconds from the driver's SIGKILL")
        ax.set_title(f"{label}: {run.report.duplicated} written again", fontsize=9)
    axes[0].set_ylabel("delay: output minus input time (ms)")
    axes[0].legend(loc="lower left", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return StaticPicture(png_bytes(fig), title)
