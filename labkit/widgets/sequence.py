"""A sequence diagram of a real protocol exchange, drawn from a trace (``labkit scenario
--trace`` / ``scenarios.run_detailed(trace=...)``), never by hand: one arrow per request,
from the client to the broker role that handles it, labelled with the API and its error."""
from __future__ import annotations

from matplotlib.figure import Figure

from labkit.widgets.static import StaticPicture, png_bytes

# Which role of the broker answers each API (with one broker, all roles are the same
# process; with several, each is the leader of a partition of its internal topic).
ROLE = {
    "InitProducerId": "transaction coordinator", "AddPartitionsToTxn": "transaction coordinator",
    "AddOffsetsToTxn": "transaction coordinator", "EndTxn": "transaction coordinator",
    "TxnOffsetCommit": "group coordinator", "JoinGroup": "group coordinator",
    "SyncGroup": "group coordinator", "OffsetFetch": "group coordinator",
    "OffsetCommit": "group coordinator", "Heartbeat": "group coordinator",
    "ConsumerGroupHeartbeat": "group coordinator", "LeaveGroup": "group coordinator",
    "Produce": "partition leader", "Fetch": "partition leader", "ListOffsets": "partition leader",
}
LANES = ("client", "transaction coordinator", "group coordinator", "partition leader")
TRANSACTION_APIS = ("InitProducerId", "AddPartitionsToTxn", "Produce", "AddOffsetsToTxn",
                    "TxnOffsetCommit", "EndTxn")


def steps(trace: list[dict], apis: tuple[str, ...] = TRANSACTION_APIS,
          transactions: int = 1) -> list[dict]:
    """The exchanges of ``apis`` from the first InitProducerId through the ``transactions``-th
    EndTxn after it: one transaction's requests, in the order the client sent them."""
    out: list[dict] = []
    ends = 0
    for row in sorted(trace, key=lambda r: r["t"]):
        if row["api"] not in apis or (not out and row["api"] != "InitProducerId"):
            continue
        out.append(row)
        if row["api"] == "EndTxn":
            ends += 1
            if ends == transactions:
                break
    return out


def sequence_picture(rows: list[dict], title: str = "one transaction, as sent") -> StaticPicture:
    fig = Figure(figsize=(9.0, 0.42 * len(rows) + 1.3))
    ax = fig.add_subplot()
    ax.set_xlim(-0.5, len(LANES) - 0.5)
    ax.set_ylim(len(rows) + 0.3, -0.9)
    ax.set_axis_off()
    for x, lane in enumerate(LANES):
        ax.plot([x, x], [-0.3, len(rows)], color="#bbb", linewidth=1)
        ax.text(x, -0.6, lane, ha="center", va="center", fontsize=9, fontweight="bold")
    for y, row in enumerate(rows, start=0):
        target = LANES.index(ROLE.get(row["api"], "partition leader"))
        ax.annotate("", xy=(target, y + 0.4), xytext=(0, y + 0.4),
                    arrowprops={"arrowstyle": "->", "color": "#c0392b" if row["error"] else "#333"})
        label = f"{row['api']} v{row['version']}"
        if row.get("producer_epoch") is not None:
            label += f"  (epoch {row['producer_epoch']})"
        if row["error"]:
            label += f"  -> {row['error']}"
        ax.text(target / 2, y + 0.25, label, ha="center", va="bottom", fontsize=8)
    ax.set_title(title, fontsize=10)
    return StaticPicture(png_bytes(fig), title)
