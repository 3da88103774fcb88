"""Cost in units a shared machine does not blur (notebook 09): the CPU time the client process
and the broker spent on a run, and the requests and bytes they exchanged on the wire.

A run's wall time on a shared 2-core machine says as much about the other processes as about
the guarantee; the CPU the run itself used and the bytes it sent do not depend on who else
was running (much less: a loaded machine still costs some CPU in cache misses and switches).

    clock = CpuClock.for_bootstrap(bootstrap)   # this process, and the broker if it is local
    start = clock.read()
    ...                                         # one run
    client_ms, broker_ms = clock.since(start)   # broker_ms is NaN when the broker is elsewhere

    before = proxy.stats(); ...; wire = wire_delta(before, proxy.stats())  # per API, a run's
"""
from __future__ import annotations

import math
import time

import pandas as pd
import psutil

LOOPBACK = ("127.0.0.1", "::1", "localhost")
# The APIs whose counts a table shows (the producer's and the reader's); the rest is summed
SHOWN_APIS = ("Produce", "AddPartitionsToTxn", "EndTxn", "Fetch")


def broker_pid(bootstrap: str) -> int | None:
    """The process listening on the bootstrap's first address when that is on this machine
    (the lab's broker), else None: a remote broker's CPU is not ours to read."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if host.strip("[]") not in LOOPBACK or not port.isdigit():
        return None
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == int(port) and conn.pid:
                return conn.pid
    except psutil.AccessDenied:  # some systems show other processes' sockets only to root
        return None
    return None


class CpuClock:
    """CPU milliseconds (user + system, every thread) of this process and of one broker."""

    def __init__(self, broker: int | None = None):
        self.broker = psutil.Process(broker) if broker else None

    @classmethod
    def for_bootstrap(cls, bootstrap: str) -> "CpuClock":
        return cls(broker_pid(bootstrap))

    def read(self) -> tuple[float, float]:
        """(this process, the broker) in CPU ms so far; the broker NaN when not measured."""
        client = time.process_time() * 1000
        if self.broker is None:
            return client, math.nan
        try:
            times = self.broker.cpu_times()
        except psutil.Error:  # the broker went away: its share is unknown, not zero
            return client, math.nan
        return client, (times.user + times.system) * 1000

    def since(self, start: tuple[float, float]) -> tuple[float, float]:
        """CPU ms of (this process, the broker) since ``start`` (a ``read()``)."""
        now = self.read()
        return round(now[0] - start[0], 1), round(now[1] - start[1], 1)


def wire_delta(before: dict, after: dict) -> dict:
    """What crossed the proxy between two ``FaultProxy.stats()``: per shown API its requests
    (``requests_<api>``) and its bytes both ways (``bytes_<api>``), then all the rest summed
    (``requests_other``, ``bytes_other``)."""
    out = {}
    for kind, ways in (("requests", ("requests",)), ("bytes", ("request_bytes", "response_bytes"))):
        delta: dict[str, int] = {}
        for way in ways:
            for api, n in after[way].items():
                delta[api] = delta.get(api, 0) + n - before[way].get(api, 0)
        for api in SHOWN_APIS:
            out[f"{kind}_{api}"] = delta.pop(api, 0)
        out[f"{kind}_other"] = sum(delta.values())
    return out


def _runs(wire: pd.DataFrame) -> pd.DataFrame:
    """``wire`` indexed by one readable label per run: "100 B, transactional@10ms"."""
    labels = [f"{size} B, {config}" for size, config in zip(wire["value_bytes"], wire["config"])]
    return wire.set_index(pd.Index(labels, name="run"))


def wire_requests_table(wire: pd.DataFrame) -> pd.DataFrame:
    """``bench.wire_grid``'s transactional runs: records per commit, and requests per commit
    (Produce, AddPartitionsToTxn sent and in brackets refused, EndTxn)."""
    out = _runs(wire[wire["transactions"] > 0])
    commits = out["transactions"]
    table = pd.DataFrame({
        "records": (out["records"] / commits).round(0),
        "Produce": (out["requests_Produce"] / commits).round(1),
        "AddPartitionsToTxn (refused)": [
            f"{a / c:.2f} ({r / c:.2f})" for a, r, c in
            zip(out["requests_AddPartitionsToTxn"], out["add_partitions_refused"], commits)],
        "EndTxn": (out["requests_EndTxn"] / commits).round(2),
    })
    table.columns.name = "per commit"
    return table


def wire_bytes_table(wire: pd.DataFrame) -> pd.DataFrame:
    """``bench.wire_grid``'s runs: the transaction requests' bytes per commit (both ways),
    and the producer's bytes per record (its Produce and transaction requests and their
    answers), against the same record size's at_least_once run."""
    out = _runs(wire)
    commits = out["transactions"].where(out["transactions"] > 0)
    txn_bytes = out["bytes_AddPartitionsToTxn"] + out["bytes_EndTxn"]
    per_record = (out["bytes_Produce"] + txn_bytes) / out["records"]
    base = wire.assign(per_record=per_record.to_numpy()).query("config == 'at_least_once'") \
        .set_index("value_bytes")["per_record"].reindex(wire["value_bytes"])
    return pd.DataFrame({
        "txn request bytes per commit": (txn_bytes / commits).round(0),
        "producer bytes per record": per_record.round(1),
        "vs at_least_once": [f"{v:+.2f} %" for v in (per_record / base.to_numpy() - 1) * 100],
    }).fillna("")


def one_of_each_per_commit(wire: pd.DataFrame) -> bool:
    """Whether every transactional run of ``bench.wire_grid`` sent exactly one EndTxn per
    commit and had exactly one AddPartitionsToTxn accepted per commit (one partition, so the
    protocol needs one of each; a refused one is retried, and counted apart)."""
    txn = wire[wire["transactions"] > 0]
    accepted = txn["requests_AddPartitionsToTxn"] - txn["add_partitions_refused"]
    return bool(len(txn)) and bool(((txn["requests_EndTxn"] == txn["transactions"])
                                    & (accepted == txn["transactions"])).all())
