"""Pictures of how things are wired, drawn by code: the lab itself (notebook 00) and the
transaction coordinator's moving parts (notebook 04).

A diagram is data (boxes and numbered arrows); the picture and its text caption are both
drawn from that data, so the caption a notebook prints (and nbval compares) names exactly
what the picture shows.

    from labkit.widgets.diagrams import LAB
    print(LAB.caption())
    LAB.picture()
"""
from __future__ import annotations

from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from labkit.widgets.static import StaticPicture, png_bytes

BOX_W, BOX_H = 25.0, 10.0  # in the diagram's units (x 0-100, y 0-60)


@dataclass(frozen=True)
class Box:
    key: str
    title: str  # bold first line, named in the caption
    detail: str  # what it does, smaller
    x: float  # centre
    y: float
    color: str = "#eef3fb"


@dataclass(frozen=True)
class Arrow:
    src: str
    dst: str
    label: str
    step: int | None = None  # numbered steps are listed in the caption, in order
    at: float = 0.5  # where along the arrow its label sits
    dy: float = 0.0  # and how far above it (short arrows: above the boxes)
    dashed: bool = False


@dataclass(frozen=True)
class Diagram:
    title: str
    boxes: tuple[Box, ...]
    arrows: tuple[Arrow, ...]

    def box(self, key: str) -> Box:
        return next(b for b in self.boxes if b.key == key)

    def caption(self) -> str:
        """The parts, then each numbered step: the same words as the picture."""
        lines = [f"{self.title}: " + ", ".join(b.title for b in self.boxes)]
        for a in sorted((a for a in self.arrows if a.step is not None), key=lambda a: a.step):
            lines.append(f"{a.step}. {self.box(a.src).title} -> {self.box(a.dst).title}: "
                         f"{' '.join(a.label.split())}")
        return "\n".join(lines)

    def figure(self) -> Figure:
        fig = Figure(figsize=(10.0, 6.0), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_axes((0.0, 0.0, 1.0, 0.93))
        ax.set_xlim(-3, 103)
        ax.set_ylim(-2, 62)
        ax.set_axis_off()
        fig.suptitle(self.title, fontsize=12, fontweight="bold")
        patches = {}
        for b in self.boxes:
            patch = FancyBboxPatch((b.x - BOX_W / 2, b.y - BOX_H / 2), BOX_W, BOX_H,
                                   boxstyle="round,pad=0.4,rounding_size=1.5",
                                   facecolor=b.color, edgecolor="#44546a", linewidth=1.2)
            ax.add_patch(patch)
            patches[b.key] = patch
            ax.text(b.x, b.y + 2.2, b.title, ha="center", va="center", fontsize=9.5,
                    fontweight="bold")
            ax.text(b.x, b.y - 1.8, b.detail, ha="center", va="center", fontsize=7.5,
                    color="#333", linespacing=1.15)
        for a in self.arrows:
            src, dst = self.box(a.src), self.box(a.dst)
            ax.annotate("", xy=(dst.x, dst.y), xytext=(src.x, src.y),
                        arrowprops={"arrowstyle": "-|>", "color": "#c0392b" if a.step else "#777",
                                    "linewidth": 1.3, "linestyle": "--" if a.dashed else "-",
                                    "patchA": patches[a.src], "patchB": patches[a.dst],
                                    "shrinkA": 4, "shrinkB": 4})
            x = src.x + (dst.x - src.x) * a.at
            y = src.y + (dst.y - src.y) * a.at + a.dy
            text = f"{a.step} {a.label}" if a.step is not None else a.label
            ax.text(x, y, text, ha="center", va="center", fontsize=7.5, color="#222",
                    bbox={"boxstyle": "round,pad=0.25", "facecolor": "white",
                          "edgecolor": "none", "alpha": 0.9})
        return fig

    def picture(self) -> StaticPicture:
        return StaticPicture(png_bytes(self.figure()), self.title)


LAB = Diagram(
    "how an experiment is wired",
    boxes=(
        Box("you", "notebook / labkit CLI", "experiments.run(...)\nlabkit scenario ...",
            12, 52, "#fdf2e0"),
        Box("runner", "runner (supervisor)", "starts the workers; SIGKILL at\nthe armed crash "
            "point; restart", 12, 28),
        Box("workers", "worker processes", "the pipeline, one per instance\n(one consumer group)",
            12, 5),
        Box("proxy", "fault proxy", "drops an ack, cuts a connection,\nrecords the trace", 50, 5),
        Box("broker", "Kafka broker (KRaft)", "input and output topics,\n__consumer_offsets, "
            "__transaction_state", 88, 28, "#e6f2ea"),
        Box("audit", "audit (checkers)", "reads the output back,\nlost / duplicated / verdict",
            50, 52, "#fdf2e0"),
        Box("inspector", "inspector / dashboard", "record batches, markers,\nLSO, producer state",
            88, 52),
    ),
    arrows=(
        Arrow("you", "broker", "input records, unique ids", 1, at=0.62),
        Arrow("you", "runner", "N instances, a crash point", 2),
        Arrow("runner", "workers", "start, kill, restart", 3),
        Arrow("workers", "proxy", "Kafka protocol", 4),
        Arrow("proxy", "broker", "forwarded (or the fault)", 5, at=0.45),
        Arrow("broker", "audit", "output, read_committed", 6, at=0.45),
        Arrow("audit", "you", "the verdict", 7),
        Arrow("inspector", "broker", "what the log holds", dashed=True),
    ))

TRANSACTION = Diagram(
    "a transaction's moving parts",
    boxes=(
        Box("producer", "producer", "transactional.id ->\nproducer id + epoch", 12, 52,
            "#fdf2e0"),
        Box("coordinator", "transaction coordinator", "the broker leading the id's\n"
            "__transaction_state partition", 52, 52),
        Box("state", "__transaction_state", "Ongoing -> PrepareCommit\n-> CompleteCommit",
            88, 52, "#e6f2ea"),
        Box("group", "group coordinator", "the broker leading the group's\n"
            "__consumer_offsets partition", 30, 28),
        Box("leaders", "partition leaders", "output partitions: data,\nthen a COMMIT/ABORT marker",
            76, 28),
        Box("offsets", "__consumer_offsets", "the offsets, pending\nuntil the marker", 30, 5,
            "#e6f2ea"),
        Box("consumer", "read_committed consumer", "reads up to the\nlast stable offset", 76, 5,
            "#fdf2e0"),
    ),
    arrows=(
        Arrow("producer", "coordinator", "InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, "
              "EndTxn", 1, dy=7.5),
        Arrow("coordinator", "state", "each state change", 2, dy=7.5),
        Arrow("producer", "leaders", "Produce (id, epoch, sequence)", 3, at=0.7),
        Arrow("producer", "group", "TxnOffsetCommit", 4, at=0.45),
        Arrow("coordinator", "leaders", "WriteTxnMarkers (data)", 5, at=0.5),
        Arrow("coordinator", "group", "WriteTxnMarkers (offsets)", 5, at=0.42),
        Arrow("group", "offsets", "offsets + marker", 6),
        Arrow("leaders", "consumer", "Fetch, up to the LSO", 7),
    ))
