"""A share-partition as a picture: one cell per offset, coloured by its state in the share
group (done, acknowledged, archived, available again, not recorded), each with its
delivery count. Drawn from what the share coordinator stores (``labkit.kafka.inspect.share``),
once (``share_picture``) or live while a share-group run goes on (``LiveShareState``)."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from labkit.kafka.inspect import Inspector
from labkit.kafka.inspect.share import NOT_RECORDED, ShareState, share_state
from labkit.widgets.live import Loop, live_frontend
from labkit.widgets.static import StaticPicture, png_bytes

PER_ROW = 40
# state -> (label, colour); "done" is below the start offset (nothing stored any more)
STYLE = {"done": ("below the start offset: done", "#bbbbbb"),
         "acknowledged": ("acknowledged", "#54a24b"),
         "archived": ("archived", "#7f1d1d"),
         "available": ("available (released, lock expired)", "#f58518"),
         NOT_RECORDED: ("not recorded (not delivered yet, or acquired now)", "#ffffff")}


def share_picture(state: ShareState, title: str | None = None) -> StaticPicture:
    """Offsets 0..end of the share-partition, PER_ROW a row; the number in a cell is the
    delivery count the coordinator stored for it."""
    title = title or "share-partition state"  # also the picture's text form: kept stable
    cells = {o: ("done", None) for o in range(max(state.start_offset, 0))}
    cells.update({o: (s, c if s != NOT_RECORDED else None) for o, (s, c) in state.offsets().items()})
    rows = max(1, -(-state.end_offset // PER_ROW))
    fig = Figure(figsize=(9.0, 0.45 * rows + 1.7))
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_xlim(0, PER_ROW)
    ax.set_ylim(rows, -0.2)
    for offset, (kind, count) in sorted(cells.items()):
        x, y = offset % PER_ROW, offset // PER_ROW
        ax.add_patch(Rectangle((x + 0.05, y + 0.05), 0.9, 0.8, facecolor=STYLE[kind][1],
                               edgecolor="#999", linewidth=0.5))
        if count:
            ax.text(x + 0.5, y + 0.47, str(count), ha="center", va="center", fontsize=7,
                    color="white" if kind in ("archived", "acknowledged") else "black")
    ax.set_title(f"{title}: share group {state.group}, {state.topic}-{state.partition}\n"
                 f"start offset {state.start_offset}, end {state.end_offset} "
                 "(numbers: delivery count)", loc="left", fontsize=8)
    ax.legend(handles=[Patch(facecolor=c, edgecolor="#999", label=label)
                       for label, c in STYLE.values()], loc="upper center",
              bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=7, frameon=False)
    fig.subplots_adjust(top=0.72, bottom=0.3)
    return StaticPicture(png_bytes(fig), title)


class LiveShareState:
    """The share-partition's picture redrawn while a run goes on (in JupyterLab), and shown
    once more when it ends (also in executed notebooks). Use as
    ``experiments.run("share-group", ..., watch=lambda t: LiveShareState(bootstrap, t["group"], t["input"]))``."""

    def __init__(self, bootstrap: str, group: str, topic: str, interval_s: float = 0.5,
                 live: bool | None = None):
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.interval_s = interval_s
        self.live = live_frontend() if live is None else live
        self._image = None
        self._loop: Loop | None = None
        self._loop_inspector: Inspector | None = None  # one Inspector per thread

    def _draw(self) -> None:
        state = share_state(self._loop_inspector, self.group, self.topic)
        self._image.value = share_picture(state).png

    def __enter__(self) -> "LiveShareState":
        if self.live:
            import ipywidgets
            from IPython.display import display

            self._image = ipywidgets.Image(format="png")
            display(self._image)
            self._loop_inspector = Inspector(self.bootstrap)
            self._loop = Loop(self._draw, self.interval_s, on_error=lambda exc: None)
            self._loop.start()
        return self

    def __exit__(self, *exc) -> None:
        from IPython.display import display

        if self._loop is not None:
            self._loop.stop()  # joins the thread: its inspector is free to close
            self._loop_inspector.close()
        with Inspector(self.bootstrap) as inspector:
            display(share_picture(share_state(inspector, self.group, self.topic)))
