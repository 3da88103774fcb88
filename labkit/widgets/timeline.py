"""The group's timeline as a picture: which instance owned which partition, over time, and
where an instance was killed. Drawn from a run's history (``labkit.checking.timeline``), once at the
end (``ownership_picture``) or live while the run goes on (``LiveOwnership``)."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from labkit.checking import history, timeline
from labkit.widgets.live import Loop, live_frontend
from labkit.widgets.static import StaticPicture, png_bytes

COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2")


def ownership_picture(events: list[dict], title: str = "partition ownership") -> StaticPicture:
    """A bar per ownership span (partition on the y axis), coloured by instance; a red line
    where an instance was killed."""
    spans = timeline.ownership(events)
    t0 = min((e["t"] for e in events), default=0.0)
    fig = Figure(figsize=(9.0, 0.45 * max(2, spans["partition"].nunique()) + 1.2))
    ax = fig.add_subplot()
    instances = sorted(spans["instance"].unique(), key=str)
    for row in spans.itertuples():
        colour = COLOURS[instances.index(row.instance) % len(COLOURS)]
        ax.barh(row.partition, row.end - row.start, left=row.start, color=colour,
                edgecolor="white", height=0.7)
    for e in events:
        if e["kind"] == "exited" and e["code"] == timeline.KILLED:
            ax.axvline(e["t"] - t0, color="#c0392b", linestyle="--", linewidth=1.2)
    ax.set_xlabel("seconds since the first event (dashed red: an instance killed)")
    ax.set_ylabel("partition")
    ax.set_yticks(sorted(spans["partition"].unique()))
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(color=COLOURS[i % len(COLOURS)], label=f"instance {inst}")
                       for i, inst in enumerate(instances)], loc="upper right", fontsize=8)
    return StaticPicture(png_bytes(fig), title)


class LiveOwnership:
    """The ownership picture of a run in progress, redrawn from its history file while the
    workers write it (in JupyterLab), and shown once more, final, when the run ends (also in
    executed notebooks). Use as ``experiments.run(..., watch=lambda t:
    LiveOwnership(t["history"]))``."""

    def __init__(self, history_file: str, title: str = "partition ownership",
                 interval_s: float = 0.5, live: bool | None = None):
        self.path, self.title, self.interval_s = history_file, title, interval_s
        self.live = live_frontend() if live is None else live
        self._image = None
        self._loop: Loop | None = None

    def _draw(self) -> None:
        events = history.read(self.path)
        if events:
            self._image.value = ownership_picture(events, self.title).png

    def __enter__(self) -> "LiveOwnership":
        if self.live:
            import ipywidgets
            from IPython.display import display

            self._image = ipywidgets.Image(format="png")
            display(self._image)
            self._loop = Loop(self._draw, self.interval_s, on_error=lambda exc: None)
            self._loop.start()
        return self

    def __exit__(self, *exc) -> None:
        from IPython.display import display

        if self._loop is not None:
            self._loop.stop()
        events = history.read(self.path)
        if events:
            display(ownership_picture(events, self.title))


def torture_picture(events: list[dict], title: str = "the app under torture") -> StaticPicture:
    """A tortured run from its history (labkit.torture.harness): the input offsets the app's group
    committed and the records in its output over time, a red line at each kill, a grey one
    at each start. Output rising past the input's end is replayed work (duplicates, or
    aborted transactions); a kill with committed offsets ahead of the output is loss."""
    progress = timeline.torture_progress(events)
    faults = timeline.torture_faults(events)
    fig = Figure(figsize=(9.0, 3.2), layout="constrained")
    ax = fig.add_subplot()
    if len(progress):
        # Hold the last values until the run's end (a change is recorded, a still app is not).
        end_t = max(progress["t"].iloc[-1], faults["t"].max() if len(faults) else 0.0)
        progress = pd.concat([progress, progress.iloc[[-1]].assign(t=end_t)], ignore_index=True)
        ax.step(progress["t"], progress["committed"], where="post", color=COLOURS[0],
                label="input offsets committed by the app's group")
        ax.step(progress["t"], progress["output"], where="post", color=COLOURS[1],
                label="records in the output (aborted ones too)")
        ax.axhline(progress["end"].iloc[-1], color="#999", linewidth=0.8, linestyle=":")
    for row in faults.itertuples():
        if row.kind == "killed":
            ax.axvline(row.t, color="#c0392b", linestyle="--", linewidth=1.2)
        elif row.kind == "started" and row.attempt and row.attempt > 1:
            ax.axvline(row.t, color="#777", linestyle=":", linewidth=1.0)
    ax.set_xlabel("seconds since the first start (dashed red: SIGKILL, dotted grey: restart)")
    ax.set_ylabel("records / offsets")
    ax.set_title(title, fontsize=10)
    if len(progress):
        ax.legend(loc="upper left", fontsize=8)
    return StaticPicture(png_bytes(fig), title)
