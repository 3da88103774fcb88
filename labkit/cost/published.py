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


CLOSE_POINTS = 5.0  # "close to" a published figure: the middle half lies within this


def _paired_pct(grid: pd.DataFrame, value_bytes: int, config: str, baseline: str,
                column: str) -> pd.Series:
    """``config``'s runs against ``baseline``'s run of the same round (same size), in %."""
    runs = grid[(grid["mode"] == "throughput") & (grid["value_bytes"] == value_bytes)]
    a = runs[runs["config"] == config].set_index("repeat")[column]
    b = runs[runs["config"] == baseline].set_index("repeat")[column]
    return ((a / b.reindex(a.index) - 1) * 100).dropna()


def _quartiles(pct: pd.Series) -> tuple[float, float, float]:
    return float(pct.median()), float(pct.quantile(0.25)), float(pct.quantile(0.75))


def _evidence(median: float, q1: float, q3: float, what: str) -> str:
    return f"{what} {median:+.1f} % (middle half {q1:+.1f} to {q3:+.1f})"


def shape(grid: pd.DataFrame, summary: pd.DataFrame | None = None,
          short_ms: float = 10.0, long_ms: float = 100.0, small: int = 100,
          large: int = 1024) -> pd.DataFrame:
    """The published shape, claim by claim, against this run (``commit_grid``'s runs and
    ``summarize(runs)``): 1 KB committed every 100 ms close to at-least-once (the middle
    half of the paired rounds within 5 points of the published -3 %; wholly outside them:
    contradicted); a shorter
    interval costlier (each round's two intervals paired: throughput and CPU per record);
    smaller records costlier (their cost against at-least-once, middle halves compared); a
    read_committed reader later in latency. Each with what was measured and, from the
    throughput and from the CPU per record (client and broker) apart, "reproduced",
    "contradicted" or "not shown beyond the spread"."""
    long_cfg, short_cfg = f"transactional@{long_ms:g}ms", f"transactional@{short_ms:g}ms"
    grid = grid.assign(cpu_ms_per_record=(grid["client_cpu_ms"] + grid["broker_cpu_ms"])
                       / grid["records"])
    rows = []
    m, q1, q3 = _quartiles(_paired_pct(grid, large, long_cfg, "at_least_once", "records_per_s"))
    cpu = _quartiles(_paired_pct(grid, large, long_cfg, "at_least_once", "cpu_ms_per_record"))
    low, high = -3.0 - CLOSE_POINTS, -3.0 + CLOSE_POINTS
    close = ("reproduced" if low <= q1 and q3 <= high  # the middle half within -3 % +- 5
             else "contradicted" if q3 < low or q1 > high else "not shown beyond the spread")
    rows.append(("1 KB records, commit every 100 ms: close to at-least-once (-3 %)",
                 _evidence(m, q1, q3, "throughput") + "; " + _evidence(*cpu, "CPU per record"),
                 close, "(no published CPU figure)"))
    for size in (small, large):
        tput = _quartiles(_paired_pct(grid, size, short_cfg, long_cfg, "records_per_s"))
        cpu = _quartiles(_paired_pct(grid, size, short_cfg, long_cfg, "cpu_ms_per_record"))
        rows.append((f"{size} B records: every {short_ms:g} ms costlier than every {long_ms:g} ms",
                     _evidence(*tput, "throughput") + "; " + _evidence(*cpu, "CPU per record"),
                     _costlier(tput, lower_is_costlier=True), _costlier(cpu, lower_is_costlier=False)))
    for interval, cfg in ((short_ms, short_cfg), (long_ms, long_cfg)):
        says, evidence = [], []
        for column, what, lower in (("records_per_s", "throughput", True),
                                    ("cpu_ms_per_record", "CPU per record", False)):
            s_, big = (_quartiles(_paired_pct(grid, size, cfg, "at_least_once", column))
                       for size in (small, large))
            costlier, cheaper = (s_[2] < big[1], s_[1] > big[2]) if lower else (s_[1] > big[2], s_[2] < big[1])
            says.append("reproduced" if costlier else "contradicted" if cheaper
                        else "not shown beyond the spread")
            evidence.append(f"{what} vs at_least_once: " + _evidence(*s_, f"{small} B")
                            + ", " + _evidence(*big, f"{large} B"))
        rows.append((f"commit every {interval:g} ms: {small} B records costlier than {large} B",
                     "; ".join(evidence), *says))
    if summary is not None and "transactional" in summary.index:
        x = summary.loc["transactional"]
        others = summary.drop(index="transactional")
        later = bool(x["latency_p50_ms_min"] > others["latency_p50_ms_max"].max())
        rows.append(("a read_committed reader gets transactional records later",
                     f"median p50 {x['latency_p50_ms']:.0f} ms, the others "
                     f"{others['latency_p50_ms'].min():.1f}-{others['latency_p50_ms'].max():.1f} ms",
                     "reproduced" if later else "not shown beyond the spread", ""))
    return pd.DataFrame(rows, columns=["published claim", "measured here (paired rounds)",
                                       "throughput says", "CPU says"]).set_index("published claim")


def _costlier(quartiles: tuple[float, float, float], lower_is_costlier: bool) -> str:
    """A paired change's verdict on "costlier": its middle half wholly on the costly side
    (less throughput, more CPU) "reproduced", wholly on the other "contradicted"."""
    verdict = difference(quartiles[1], quartiles[2])
    costly, cheap = ("slower", "faster") if lower_is_costlier else ("faster", "slower")
    return {costly: "reproduced", cheap: "contradicted"}.get(verdict, "not shown beyond the spread")
