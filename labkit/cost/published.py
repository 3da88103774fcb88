"""What Kafka's authors published about the cost of exactly-once, set beside the cell of the
measured grid each figure describes (notebook 09), and why the two differ, in sentences made
from this run's numbers."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pandas as pd

from labkit.cost.findings import difference
from labkit.cost.lane import DEFAULT_COMMIT_INTERVAL_MS


@dataclass(frozen=True)
class Published:
    source: str
    setting: str
    versus: str  # what the cost was measured against
    low_pct: float  # the throughput change published, as a range (low == high: one figure)
    high_pct: float
    value_bytes: int | None  # the measured cell it is set beside
    commit_interval_ms: float | None
    baseline: str  # the lab's guarantee standing in for ``versus``

    def figure_text(self) -> str:
        """The published figure as printed: one value, or its range."""
        if self.low_pct == self.high_pct:
            return f"{self.low_pct:+.0f} %"
        return f"{self.low_pct:+.0f} to {self.high_pct:+.0f} %"


PUBLISHED = (
    Published("Confluent blog, Transactions in Apache Kafka (Mehta, Gustafson 2017)",
              "producer, 1 KB records, commit every 100 ms",
              "at-least-once, in order (acks=all, 1 in flight)", -3.0, -3.0, 1024, 100.0,
              "at_least_once"),
    Published("Confluent blog, Exactly-once Semantics Are Possible (Narkhede 2017)",
              "producer, 1 KB records, transactions of 100 ms",
              "at-most-once (acks=1, 5 in flight)", -20.0, -20.0, 1024, 100.0, "at_most_once"),
    Published("Kafka Streams exactly-once, as Confluent published it",
              "Streams app, commit.interval.ms=100", "at-least-once Streams",
              -30.0, -15.0, None, 100.0, "at_least_once"),
)


def _measured_cell(pub: Published, grid_table: pd.DataFrame,
                   versus_at_most_once: pd.DataFrame | None) -> tuple[pd.Series, str] | None:
    """The measured row a published figure is set beside, and how to name it."""
    if pub.baseline == "at_most_once":
        if versus_at_most_once is None:
            return None
        return versus_at_most_once.loc["transactional"], "transactional vs at_most_once (section 2)"
    key = f"transactional@{pub.commit_interval_ms:g}ms"
    sizes = sorted(grid_table.index.get_level_values("value_bytes").unique())
    size = pub.value_bytes if pub.value_bytes in sizes else max(sizes)  # Streams: no size given
    return grid_table.loc[(size, key)], f"{key}, {size} B records"


def _placement(pub: Published, q1: float, q3: float) -> str:
    if pub.high_pct < q1:
        return "published cost larger than measured"
    if pub.low_pct > q3:
        return "published cost smaller than measured"
    return "within the spread"


def _placed(grid_table: pd.DataFrame, versus_at_most_once: pd.DataFrame | None,
            published: tuple[Published, ...]
            ) -> Iterator[tuple[Published, pd.Series, str, float, float, str]]:
    """Each published figure that has a measured cell: the figure, the cell, how to name it,
    the middle half of its paired rounds (q1, q3) and where the figure lies against it."""
    for pub in published:
        found = _measured_cell(pub, grid_table, versus_at_most_once)
        if found is None:
            continue
        cell, measured_at = found
        q1, q3 = float(cell["vs_baseline_pct_q1"]), float(cell["vs_baseline_pct_q3"])
        yield pub, cell, measured_at, q1, q3, _placement(pub, q1, q3)


def beside_published(grid_table: pd.DataFrame, versus_at_most_once: pd.DataFrame | None = None,
                     published: tuple[Published, ...] = PUBLISHED) -> pd.DataFrame:
    """Each published figure beside the measured cell it describes: the median throughput
    change of the paired rounds, their middle half, and whether the published figure lies
    inside that middle half ("within the spread") or outside it, and on which side.

    ``grid_table`` is ``summarize_grid``'s; the figure against at-most-once needs
    ``versus_at_most_once``, a ``summarize(runs, baseline="at_most_once")`` table."""
    rows = []
    for pub, cell, measured_at, q1, q3, placement in _placed(grid_table, versus_at_most_once,
                                                             published):
        rows.append({"published": pub.figure_text(),
                     "setting": pub.setting, "versus": pub.versus, "source": pub.source,
                     "measured here": measured_at,
                     "measured_pct": float(cell["throughput_vs_baseline_pct"]),
                     "middle_half_pct": f"{q1:+.1f} to {q3:+.1f}",
                     "comparison": placement})
    return pd.DataFrame(rows)


def explain(grid_table: pd.DataFrame, summary: pd.DataFrame,
            versus_at_most_once: pd.DataFrame | None = None,
            published: tuple[Published, ...] = PUBLISHED) -> list[str]:
    """Why each published figure and this run differ, in sentences made from this run's
    numbers: for a figure against at-least-once, how long a commit held the producer here
    versus what the published cost leaves per commit; for the one against at-most-once,
    whether at_most_once was faster than at_least_once here at all (``summary`` is
    ``summarize(runs)``, baseline at_least_once)."""
    lines = []
    for pub, cell, measured_at, _, _, placement in _placed(grid_table, versus_at_most_once,
                                                           published):
        published_text = pub.figure_text()
        head = f"{pub.source}: published {published_text}, measured {measured_at} " \
               f"{float(cell['throughput_vs_baseline_pct']):+.1f} %: {placement}"
        if placement == "within the spread":
            lines.append(head + ".")
        elif pub.baseline == "at_least_once":
            # a commit stalls the producer for w ms every interval i: cost ~ w / (i + w)
            interval = pub.commit_interval_ms or DEFAULT_COMMIT_INTERVAL_MS
            implied = [-p / 100 * interval / (1 + p / 100) for p in (pub.high_pct, pub.low_pct)]
            implied_text = f"{implied[0]:.0f}" if pub.low_pct == pub.high_pct \
                else f"{implied[0]:.0f}-{implied[1]:.0f}"
            lines.append(head + f"; here each commit held the producer {cell['ms_per_commit']:.0f} ms "
                         f"(median; {cell['commit_wait_pct']:.0f} % of the run), "
                         f"{cell['flush_ms_per_commit']:.0f} ms of it waiting for the "
                         "transaction's records to be acknowledged and "
                         f"{cell['ms_per_commit'] - cell['flush_ms_per_commit']:.0f} ms in the "
                         f"commit itself; a {published_text} cost at a {interval:g} ms interval "
                         f"leaves about {implied_text} ms per commit.")
        else:
            amo = summary.loc["at_most_once"]
            verdict = difference(amo["vs_baseline_pct_q1"], amo["vs_baseline_pct_q3"])
            lines.append(head + f"; here at_most_once (acks=0) vs at_least_once: "
                         f"{float(amo['throughput_vs_baseline_pct']):+.1f} %, {verdict}"
                         + (": fire-and-forget bought no throughput on this machine, so "
                            "there was no such gap for transactions to lose." if verdict != "faster"
                            else "."))
    return lines
