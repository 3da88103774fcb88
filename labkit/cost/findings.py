"""What the cost benchmark's runs say (``labkit.cost.bench``): medians, spread, each
run paired with its baseline's run of the same round, and a conclusion whose every word is
derived from those numbers."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

PAIR_KEYS = ["repeat", "value_bytes"]  # a run's baseline: same round, same record size


def _vs_baseline_pct(fast: pd.DataFrame, by: str, baseline: str | int,
                     column: str = "records_per_s") -> pd.Series:
    """Each throughput run's ``column`` against its baseline's run of the same round and
    size, in %: pairing cancels what the rest of the machine did to that round."""
    base = fast[fast[by] == baseline].set_index(PAIR_KEYS)[column]
    # a baseline that used no measurable CPU (under one 10 ms tick) gives no ratio, not inf
    paired = base.where(base > 0).reindex(pd.MultiIndex.from_frame(fast[PAIR_KEYS])).to_numpy()
    return pd.Series((fast[column].to_numpy() / paired - 1) * 100, index=fast.index)


def _cpu(out: pd.DataFrame, fast: pd.DataFrame, by: str, baseline: str | int | None) -> None:
    """CPU ms per 1,000 records of the client process and of the broker (medians of the
    rounds) and, with a baseline, each paired with the baseline's run of the same round."""
    fast = fast.assign(**{f"{who}_cpu_ms_per_1k": fast[f"{who}_cpu_ms"] / fast["records"] * 1000
                          for who in ("client", "broker")})
    for who in ("client", "broker"):
        column = f"{who}_cpu_ms_per_1k"
        out[column] = fast.groupby(by, sort=False)[column].median().round(1)
        if baseline is not None and baseline in out.index:
            pct = _vs_baseline_pct(fast, by, baseline, column).groupby(fast[by], sort=False)
            out[f"{who}_cpu_vs_baseline_pct"] = pct.median().round(1)
            out[f"{who}_cpu_vs_baseline_pct_q1"] = pct.quantile(0.25).round(1)
            out[f"{who}_cpu_vs_baseline_pct_q3"] = pct.quantile(0.75).round(1)


def summarize(runs: pd.DataFrame, by: str = "guarantee",
              baseline: str | int | None = "at_least_once") -> pd.DataFrame:
    """One row per ``by``: median throughput of the throughput runs with its range
    (``_min``/``_max``), median latency of the paced runs, whether every run delivered every
    record once, and (with a ``baseline``) the throughput relative to the baseline's run of
    the same round: median (``throughput_vs_baseline_pct``), the middle half of the rounds
    (``_q1``/``_q3``) and the range (``_min``/``_max``). For transactional runs also the
    median share of the run the producer waited in commit_transaction() and ms per commit."""
    fast, paced = runs[runs["mode"] == "throughput"], runs[runs["mode"] == "latency"]
    tput = fast.groupby(by, sort=False)["records_per_s"]
    out = pd.DataFrame({
        "records_per_s": tput.median(), "records_per_s_min": tput.min(),
        "records_per_s_max": tput.max(),
        "mb_per_s": fast.groupby(by, sort=False)["mb_per_s"].median(),
        "latency_p50_ms": paced.groupby(by, sort=False)["latency_p50_ms"].median(),
        "latency_p99_ms": paced.groupby(by, sort=False)["latency_p99_ms"].median(),
        "latency_p50_ms_min": paced.groupby(by, sort=False)["latency_p50_ms"].min(),
        "latency_p50_ms_max": paced.groupby(by, sort=False)["latency_p50_ms"].max(),
    }).reindex(list(dict.fromkeys(runs[by])))  # in the order the runs came, not sorted
    out["runs"] = runs.groupby(by, sort=False).size()
    complete = (runs["delivered"] == runs["records"]) & (runs["duplicates"] == 0)
    out["all_delivered"] = complete.groupby(runs[by], sort=False).all()
    if baseline is not None and baseline in out.index:
        pct = _vs_baseline_pct(fast, by, baseline).groupby(fast[by], sort=False)
        out["throughput_vs_baseline_pct"] = pct.median().round(1)
        out["vs_baseline_pct_q1"] = pct.quantile(0.25).round(1)
        out["vs_baseline_pct_q3"] = pct.quantile(0.75).round(1)
        out["vs_baseline_pct_min"] = pct.min().round(1)
        out["vs_baseline_pct_max"] = pct.max().round(1)
    if "commit_seconds" in fast and (fast["transactions"] > 0).any():
        txn = fast[fast["transactions"] > 0]
        share = (txn["commit_seconds"] / txn["seconds"] * 100).groupby(txn[by], sort=False)
        per_commit = (txn["commit_seconds"] / txn["transactions"] * 1000).groupby(txn[by], sort=False)
        flushing = (txn["flush_seconds"] / txn["transactions"] * 1000).groupby(txn[by], sort=False)
        out["commit_wait_pct"] = share.median().round(1)
        out["ms_per_commit"] = per_commit.median().round(1)
        out["flush_ms_per_commit"] = flushing.median().round(1)
    if "client_cpu_ms" in fast:
        _cpu(out, fast, by, baseline)
    return out


def summarize_grid(grid: pd.DataFrame) -> pd.DataFrame:
    """``commit_grid``'s runs: one row per (value_bytes, config), as ``summarize`` with the
    same-size ``at_least_once`` run of each round as the baseline."""
    parts = {size: summarize(runs, by="config", baseline="at_least_once")
             for size, runs in grid.groupby("value_bytes", sort=True)}
    return pd.concat(parts, names=["value_bytes", "config"])


def difference(q1_pct: float, q3_pct: float) -> str:
    """"slower" / "faster" when the middle half of the paired rounds lies wholly below /
    above the baseline, else "no difference beyond the spread"."""
    if q3_pct < 0:
        return "slower"
    if q1_pct > 0:
        return "faster"
    return "no difference beyond the spread"


@dataclass(frozen=True)
class Conclusion:
    """What one ``summarize`` table says, every field derived from the table's numbers."""

    baseline: str
    fastest: str
    fastest_records_per_s: float
    runner_up: str
    fastest_clear: bool  # the fastest's middle half of rounds above the runner-up's
    compared: dict[str, tuple[float, float, float, str]]  # name -> median %, q1, q3, verdict
    slowest_to_read: str | None  # highest median p50 latency of the paced runs
    slowest_to_read_p50_ms: float | None
    slowest_to_read_clear: bool  # its fastest paced run slower than every other's slowest

    def verdict(self, name: str) -> str:
        """"slower" / "faster" / "no difference beyond the spread" for ``name``."""
        return self.compared[name][3]

    def headline(self, exactly_once: str = "transactional") -> str:
        """What exactly-once cost in this run, in one sentence derived from the numbers."""
        median, q1, q3, verdict = self.compared[exactly_once]
        if verdict == "slower":
            cost = (f"had {-median:.0f} % less throughput than {self.baseline} (the middle half "
                    f"of the rounds: {-q3:.0f} to {-q1:.0f} % less)")
        elif verdict == "faster":  # noise can do this: the appendix shows the rounds
            cost = (f"ran {median:.0f} % faster than {self.baseline} (middle half of the rounds "
                    f"{q1:+.0f} to {q3:+.0f} %): the rounds disagree with the usual cost, see the appendix")
        else:
            cost = (f"showed no throughput difference from {self.baseline} beyond the spread of "
                    f"the rounds ({q1:+.0f} to {q3:+.0f} %)")
        if self.slowest_to_read == exactly_once:
            wait = (f"and a read_committed reader waited longest for its records (median "
                    f"{self.slowest_to_read_p50_ms:.0f} ms: a record is readable once its "
                    "transaction commits)")
        elif self.slowest_to_read is not None:
            wait = f"and a read_committed reader waited longest for {self.slowest_to_read}, not for it"
        else:
            wait = "(no latency measured)"
        return f"In this run, exactly-once ({exactly_once}) {cost}, {wait}."

    def lines(self) -> list[str]:
        out = [f"fastest: {self.fastest} (median {self.fastest_records_per_s:,.0f} records/s), "
               f"ahead of {self.runner_up} beyond the spread: "
               f"{'yes' if self.fastest_clear else 'no'}"]
        for name, (median, q1, q3, verdict) in self.compared.items():
            out.append(f"{name} vs {self.baseline}: {median:+.1f} % throughput "
                       f"(middle half of the rounds {q1:+.1f} to {q3:+.1f} %): {verdict}")
        if self.slowest_to_read is not None:
            out.append(f"longest wait for a read_committed reader: {self.slowest_to_read} "
                       f"(median p50 {self.slowest_to_read_p50_ms:.0f} ms), longer than every "
                       f"other guarantee in every round: {'yes' if self.slowest_to_read_clear else 'no'}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def conclude(summary: pd.DataFrame, baseline: str = "at_least_once") -> Conclusion:
    """The conclusion of a ``summarize`` table (with ``baseline``): which guarantee was
    fastest (median throughput), whether it was ahead of the next beyond the spread (its
    lower quartile vs the baseline above the next one's upper quartile), and for every other
    guarantee whether it was slower / faster than the baseline beyond the spread."""
    needed = {"records_per_s", "throughput_vs_baseline_pct", "vs_baseline_pct_q1",
              "vs_baseline_pct_q3"}
    if missing := needed - set(summary.columns):
        raise ValueError(f"conclude() needs a summarize() table with a baseline; missing {sorted(missing)}")
    if baseline not in summary.index or len(summary) < 2:
        raise ValueError(f"conclude() needs the baseline {baseline!r} and one more row; "
                         f"the table has {list(summary.index)}")
    ranked = summary.sort_values("records_per_s", ascending=False)
    fastest, runner_up = ranked.index[0], ranked.index[1]
    compared = {
        name: (float(row.throughput_vs_baseline_pct), float(row.vs_baseline_pct_q1),
               float(row.vs_baseline_pct_q3),
               difference(row.vs_baseline_pct_q1, row.vs_baseline_pct_q3))
        for name, row in summary.iterrows() if name != baseline}
    slowest, slowest_p50, slowest_clear = None, None, False
    if {"latency_p50_ms", "latency_p50_ms_min", "latency_p50_ms_max"} <= set(summary.columns) \
            and summary["latency_p50_ms"].notna().all():
        slowest = summary["latency_p50_ms"].idxmax()
        slowest_p50 = float(summary.loc[slowest, "latency_p50_ms"])
        others = summary.drop(index=slowest)
        slowest_clear = bool(summary.loc[slowest, "latency_p50_ms_min"] > others["latency_p50_ms_max"].max())
    return Conclusion(
        baseline=baseline, fastest=str(fastest),
        fastest_records_per_s=float(ranked["records_per_s"].iloc[0]), runner_up=str(runner_up),
        fastest_clear=bool(ranked["vs_baseline_pct_q1"].iloc[0] > ranked["vs_baseline_pct_q3"].iloc[1]),
        compared=compared, slowest_to_read=None if slowest is None else str(slowest),
        slowest_to_read_p50_ms=slowest_p50, slowest_to_read_clear=slowest_clear)


def commit_wait_falls_with_interval(grid_table: pd.DataFrame) -> bool:
    """Whether, at every record size of a ``summarize_grid`` table, the producer waited in
    commit_transaction() for a smaller share of the run the longer its commit interval."""
    for _, cells in grid_table.groupby(level="value_bytes"):
        txn = cells[cells["commit_wait_pct"].notna()].droplevel("value_bytes")
        by_interval = sorted((float(config.split("@")[1].removesuffix("ms")), wait)
                             for config, wait in txn["commit_wait_pct"].items())
        waits = [wait for _, wait in by_interval]
        if len(waits) < 2 or any(a <= b for a, b in zip(waits, waits[1:])):
            return False
    return True


def _span(low: pd.Series, high: pd.Series, spec: str) -> pd.Series:
    """"low to high" per row, each number formatted with ``spec``."""
    return pd.Series([f"{a:{spec}} to {b:{spec}}" for a, b in zip(low, high)], index=low.index)


def _shown(values: pd.Series, spec: str) -> pd.Series:
    """Each number formatted with ``spec``; blank where there is none (a baseline's row)."""
    return values.map(lambda v: "" if pd.isna(v) else f"{v:{spec}}")


def _with(main: pd.Series, aside: pd.Series, spec: str) -> pd.Series:
    """"main (aside)" per row: two numbers a reader compares, in one column."""
    return pd.Series([f"{a:{spec}} ({b})" if pd.notna(a) else "" for a, b in zip(main, aside)],
                     index=main.index)


def _vs_baseline(table: pd.DataFrame) -> pd.Series:
    middle = _span(table["vs_baseline_pct_q1"], table["vs_baseline_pct_q3"], "+.1f")
    return _with(table["throughput_vs_baseline_pct"], middle, "+.1f")


def guarantees_view(summary: pd.DataFrame) -> pd.DataFrame:
    """``summarize(runs)`` as a reader's table: four columns with plain names."""
    waits = pd.Series([f"{a:.0f} / {b:.0f}" for a, b in
                       zip(summary["latency_p50_ms"], summary["latency_p99_ms"])],
                      index=summary.index)
    return pd.DataFrame({
        "records/s": summary["records_per_s"].round().astype(int),
        "range of rounds": _span(summary["records_per_s_min"], summary["records_per_s_max"], ".0f"),
        "vs at_least_once % (middle half)": _vs_baseline(summary),
        "reader wait ms, p50 / p99": waits,
    })


def grid_view(grid_table: pd.DataFrame) -> pd.DataFrame:
    """``summarize_grid(grid)`` as a reader's table: four columns with plain names."""
    return pd.DataFrame({
        "records/s": grid_table["records_per_s"].round().astype(int),
        "vs at_least_once % (middle half)": _vs_baseline(grid_table),
        "committing %": _shown(grid_table["commit_wait_pct"], ".1f"),
        "ms per commit (of it flush)": _with(grid_table["ms_per_commit"],
                                             _shown(grid_table["flush_ms_per_commit"], ".1f"),
                                             ".1f"),
    })



def _ms_and_pct(table: pd.DataFrame, who: str, baseline: str) -> pd.Series:
    """"ms (median %: middle half)" of the client's or the broker's CPU per 1,000 records;
    the baseline's own rows (and a table without a baseline) the ms alone."""
    ms = table[f"{who}_cpu_ms_per_1k"]
    if f"{who}_cpu_vs_baseline_pct" not in table:
        return _shown(ms, ".1f")
    pct = table[f"{who}_cpu_vs_baseline_pct"]
    middle = _span(table[f"{who}_cpu_vs_baseline_pct_q1"], table[f"{who}_cpu_vs_baseline_pct_q3"], "+.0f")
    names = [key[-1] if isinstance(key, tuple) else key for key in table.index]
    return pd.Series([f"{m:.1f}" if name == baseline or pd.isna(p) else f"{m:.1f} ({p:+.0f} %: {h})"
                      for name, m, p, h in zip(names, ms, pct, middle)], index=table.index)


def cpu_view(table: pd.DataFrame, baseline: str = "at_least_once") -> pd.DataFrame:
    """CPU per 1,000 records of a ``summarize`` or ``summarize_grid`` table: the client
    process (producer, reader, the notebook's Python) and the broker; in brackets the median
    change against the baseline's run of the same round, and the middle half of the rounds."""
    return pd.DataFrame({"client CPU ms / 1,000 records": _ms_and_pct(table, "client", baseline),
                         "broker CPU ms / 1,000 records": _ms_and_pct(table, "broker", baseline)})
