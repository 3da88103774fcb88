"""A sequence diagram of a real protocol exchange, drawn from a trace (``labkit scenario
--trace`` / ``experiments.run(..., trace=...)``), never by hand: one arrow per request,
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
# What two producers sharing a transactional.id say to the broker when one fences the other.
FENCING_APIS = ("InitProducerId", "AddPartitionsToTxn", "Produce", "EndTxn")


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


# Answers of a coordinator that is not ready yet (a fresh broker still creating or loading
# __transaction_state): the client retries them; they depend on when the run starts.
COORDINATOR_NOT_READY = ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS",
                         "COORDINATOR_NOT_AVAILABLE")


def exchanges(trace: list[dict], apis: tuple[str, ...] = FENCING_APIS,
              hide_errors: tuple[str, ...] = COORDINATOR_NOT_READY) -> list[dict]:
    """The exchanges of ``apis`` in the order they were sent, so that the sequence does not
    depend on timing: a run of identical ones (same client, API, version and error: a retry,
    or one flush split into two requests) is kept once, and answers with ``hide_errors``
    (retried by the client, there only when the broker has just started) are left out."""
    out: list[dict] = []
    for row in sorted(trace, key=lambda r: r["t"]):
        if row["api"] not in apis or row["error"] in hide_errors:
            continue
        same = ("client_id", "api", "version", "error")
        if out and all(out[-1].get(k) == row.get(k) for k in same):
            continue
        out.append(row)
    return out


def label(row: dict, by_client: bool = False) -> str:
    """One exchange in words, as the picture labels its arrow: API, version, the producer
    epoch where the request or answer carries one, the error."""
    text = f"{row['api']} v{row['version']}"
    if row.get("producer_epoch") is not None and row["producer_epoch"] >= 0:
        text += f"  (epoch {row['producer_epoch']})"
    if row["error"]:
        text += f"  -> {row['error']}"
    return f"{row['client_id']}: {text}" if by_client else text


def sequence_picture(rows: list[dict], title: str = "one transaction, as sent",
                     by_client: bool = False) -> StaticPicture:
    """``by_client``: name the client on each arrow (several clients in one picture)."""
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
        ax.text(target / 2, y + 0.25, label(row, by_client), ha="center", va="bottom", fontsize=8)
    ax.set_title(title, fontsize=10)
    return StaticPicture(png_bytes(fig), title)
