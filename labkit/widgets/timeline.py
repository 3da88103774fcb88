"""The group's timeline as a picture: which instance owned which partition, over time, and
where an instance was killed. Drawn from a run's history (``labkit.timeline``), once at the
end (``ownership_picture``) or live while the run goes on (``LiveOwnership``)."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from labkit import history, timeline
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
    executed notebooks). Use as ``scenarios.run_detailed(..., watch=lambda t:
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
