"""A static picture of a crash-restart run: which batches each attempt ran, and how it ended.

One lane per attempt; each micro-batch is a bar over the input records it covers (offsets
summed over partitions), coloured by its outcome. A batch planned but not committed in
attempt 1 and run again in attempt 2 is the replay the lesson is about.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure  # no pyplot: no global state, works headless
from matplotlib.patches import Rectangle

from labkit.spark.supervised import Run

COLOURS = {
    "committed": "#2e7d32",
    "committed, then crashed": "#1b4d1e",
    "sink done, crashed before commit": "#ef6c00",
    "crashed in the sink": "#c62828",
    "planned, not committed": "#9e9e9e",
    "planned, never ran": "#e0e0e0",
}


def batch_spans(run: Run) -> pd.DataFrame:
    """attempt, batch_id, first/last record position, outcome, replay: the bars to draw."""
    timeline = run.timeline
    rows = []
    earlier: set[tuple[str, int]] = set()  # batches an earlier attempt left in its checkpoint
    for a in run.attempts:
        ran = timeline[timeline["attempt"] == a.number].set_index("batch_id")
        for batch, g in a.checkpoint.groupby("batch_id"):
            if (a.checkpoint_dir, batch) in earlier and batch not in ran.index:
                continue  # inherited from the checkpoint, not this attempt's work
            outcome, replay = "planned, never ran", False
            if batch in ran.index:
                outcome, replay = ran.loc[batch, "outcome"], bool(ran.loc[batch, "replay"])
            rows.append({"attempt": a.number, "batch_id": int(batch),
                         "start": int(g["start_offset"].sum()), "end": int(g["end_offset"].sum()),
                         "outcome": outcome, "replay": replay})
        earlier |= {(a.checkpoint_dir, b) for b in a.checkpoint["batch_id"]}
    return pd.DataFrame(rows, columns=["attempt", "batch_id", "start", "end", "outcome", "replay"])


def plot_run(run: Run, path: str | Path | None = None, title: str | None = None):
    """Draw the run (and save it as PNG when ``path`` is given); returns the Figure."""
    spans = batch_spans(run)
    fig = Figure(figsize=(8, 1.3 + 0.7 * len(run.attempts)))
    ax = fig.subplots()
    for s in spans.itertuples():
        y = len(run.attempts) - s.attempt
        ax.barh(y, s.end - s.start, left=s.start, height=0.6, color=COLOURS[s.outcome],
                edgecolor="black", hatch="//" if s.replay else None)
        ax.text((s.start + s.end) / 2, y, f"batch {s.batch_id}" + (" (replay)" if s.replay else ""),
                ha="center", va="center", fontsize=8, color="white" if s.outcome != "planned, never ran" else "black")
    ax.set_yticks([len(run.attempts) - a.number for a in run.attempts],
                  [f"attempt {a.number}" + (f"\nkilled at {a.crash_at}" if a.crashed else "")
                   for a in run.attempts], fontsize=8)
    ax.set_xlabel("input records (offsets summed over partitions)")
    crash = next((a.crash_at for a in run.attempts if a.crashed), None)
    ax.set_title(title or f"{run.job.query} [{run.job.sink.kind} sink], crash: {crash}", fontsize=10)
    used = [o for o in COLOURS if o in set(spans["outcome"])]
    fig.legend([Rectangle((0, 0), 1, 1, color=COLOURS[o]) for o in used], used, fontsize=7,
               loc="lower center", ncol=min(len(used), 4), frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def live_log():
    """An ipywidgets view that grows while a run goes on, and the callback that feeds it:

        widget, on_event = live_log(); display(widget)
        run_until_done(job, crash_at, on_event=on_event)
    """
    import ipywidgets as widgets

    rows: list[str] = []
    out = widgets.HTML("<i>waiting for the first micro-batch...</i>")

    def on_event(e: dict) -> None:
        if e["event"] == "batch-start":
            rows.append(f"<tr><td>{e['attempt']}</td><td>{e['batch']}</td><td>{e['rows']}</td>"
                        "<td>sink running</td></tr>")
        elif e["event"] == "batch-end" and rows:
            skipped = f" (skipped replay: {', '.join(e['skipped'])})" if e.get("skipped") else ""
            rows[-1] = rows[-1].replace("sink running", f"sink done in {e['seconds']:.2f} s{skipped}")
        elif e["event"] == "crashed":
            rows.append(f"<tr><td>{e['attempt']}</td><td colspan=3><b>killed at {e['crash_at']}"
                        "</b>, restarting</td></tr>")
        out.value = ("<table><tr><th>attempt</th><th>batch</th><th>records</th><th>sink</th></tr>"
                     + "".join(rows) + "</table>")

    return out, on_event


def show_live_log() -> Callable[[dict], None]:
    """``live_log`` shown where widgets render (JupyterLab); returns its ``on_event``.

    Executed notebooks (nbconvert, nbval) render no widgets: nothing is displayed there, and
    the run is shown afterwards by ``plot_run`` and the run's timeline."""
    from labkit.progress import live_frontend

    widget, on_event = live_log()
    if live_frontend():
        from IPython.display import display

        display(widget)
    return on_event
