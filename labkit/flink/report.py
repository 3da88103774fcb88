"""What a Flink experiment found, in the one run record: the audit of the output read
read_committed (the checker), the run's facts, and how the record prints.

    run = experiments.run("flink-crash", guarantee="exactly_once", kill_at="mid-checkpoint")
    run.report                 # the one audit of the output, read_committed
    run.kills                  # what each SIGKILL hit (labkit.flink.aim.Kill)
    run.starts                 # each start: restored from which checkpoint, how it ended
    run.latency                # input CreateTime -> visible to read_committed, p50/p99
    run.transactions           # the sink's transactional ids by their end state at the broker
    run.flink_said             # Flink's own log lines about commits that failed
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd

from labkit.checking import reads
from labkit.checking.audit import AuditReport
from labkit.checking.checks import TopicAudit
from labkit.flink import visibility
from labkit.flink.aim import AimedKill, Kill
from labkit.flink.outcome import checkpoint_of, commit_failures, sink_transactions
from labkit.kafka.inspect.client import Inspector


def kills(run: Any) -> list[Kill]:
    """What the nemesis's aimed kills hit, in order."""
    return [f.kill for f in run.nemesis.of(AimedKill) if f.kill is not None]


@dataclass(frozen=True)
class OutputAudit:
    """The output as a read_committed reader sees it, against the payments produced
    (``TopicAudit``: its read kept in the run's history); the fault it names is what the
    aimed kills hit, as the history's ``fault`` entries say (not the live nemesis), so a
    stored run is checked again to the same report."""

    guarantee: str

    replayable: ClassVar[bool] = True

    def __call__(self, run: Any) -> AuditReport:
        hit = [e["kill"] for e in reads.events(run) if e.get("kind") == "fault"
               and e.get("fault") == AimedKill.__name__ and "kill" in e]
        return TopicAudit(run.experiment, self.guarantee, fault="; ".join(hit) or None)(run)


def facts(run: Any) -> dict:
    """What the run found besides the audit, read while its topics and folder are there."""
    job = run.clients  # labkit.flink.clients.FlinkJob
    hit = kills(run)
    found = visibility.delays(run.bootstrap, run.topics["input"], run.topics["output"])
    with Inspector(run.bootstrap) as inspector:
        transactions = sink_transactions(inspector, job.setup.prefix)
    first_kill_ms = min((k.at * 1000 for k in hit), default=float("inf"))
    return {
        "guarantee": job.guarantee, "checkpoint_interval_ms": job.interval_ms,
        "transaction_timeout_ms": job.timeout_ms,
        "down_s": [f.down_s for f in run.nemesis.of(AimedKill)],
        "kills": hit, "starts": list(job.starts),
        # each restart's start to its first completed checkpoint (JVM, local cluster, restore)
        "restore_s": [s.first_checkpoint_s for s in job.starts[1:]
                      if s.first_checkpoint_s is not None],
        # the payments visible before the first kill: the latency of a job undisturbed
        "latency": visibility.quantiles(found, visible_before_ms=first_kill_ms),
        # the same payments' time to be in the output's log (read_uncommitted could read them)
        "written": visibility.quantiles(found, visible_before_ms=first_kill_ms, of="written"),
        # ... and from there to visible: the wait for the commit (0 without transactions)
        "committing": visibility.quantiles(found, visible_before_ms=first_kill_ms,
                                           of="committing"),
        "latency_all": visibility.quantiles(found),  # the restarts' wait included
        "transactions": transactions,
        "flink_said": commit_failures(job.setup.dir),
        "run_id": run.run_id,  # in every name of the run: topics, group, prefix, folder
        "prefix": job.setup.prefix,  # the sink's transactional ids: <prefix>-<subtask>-<N>
    }


def sink_view(run: Any, bootstrap: str) -> pd.DataFrame:
    """The inspector's view of the sink's transactions after the run (its topics kept): one
    row per transaction, that is one use of a transactional id, indexed by the id's
    ``<subtask>-<checkpoint>`` and the epoch its records carry. A restored job reuses the ids
    after the checkpoint it restored (the same producer id, a new epoch), so one id may have
    an aborted use and a committed one: each is its own row. A row holds its state at the
    coordinator when a kill froze the job (a pre-committed or completed checkpoint's:
    Ongoing), the id's state now (on its latest use; "reused" on an earlier one) and what its
    records became, closed by an ABORT or a COMMIT marker. Ids opened for a checkpoint and
    never written (Empty) are left out. ``bootstrap``: the run's cluster."""
    frozen = {(k.transaction, k.producer_epoch): k.state for k in run.kills if k.transaction}
    with Inspector(bootstrap) as inspector:
        listed = {t: v for t, v in inspector.listed_transactions().items()
                  if t.startswith(run.prefix + "-")}
        o = inspector.offsets(run.topics["output"])[0]
        batches = inspector.batches(run.topics["output"], 0, o.log_start, o.high_watermark)
    rows = []
    for tid in sorted(listed, key=lambda t: (checkpoint_of(t), t)):
        state, producer = listed[tid]
        uses = _transactions(b for b in batches if b.producer_id == producer)
        uses += [(e, "", 0) for (t, e) in frozen
                 if t == tid and e is not None and e not in {u[0] for u in uses}]
        uses.sort()
        for n, (epoch, marker, records) in enumerate(uses):
            rows.append({"transaction": tid[len(run.prefix) + 1:], "epoch": epoch,
                         "when killed": frozen.get((tid, epoch), ""),
                         "state now": state if n == len(uses) - 1 else "reused",
                         "records aborted": records if marker == "ABORT" else 0,
                         "records committed": records if marker == "COMMIT" else 0})
    return pd.DataFrame(rows).set_index(["transaction", "epoch"])


def killed(view: pd.DataFrame, kill: Kill) -> pd.Series:
    """The row of ``sink_view`` that ``kill`` hit: its transactional id's use then."""
    if kill.transaction is None or kill.producer_epoch is None:
        raise ValueError(f"{kill.describe()}: no transaction of the sink's was hit")
    return view.loc[("-".join(kill.transaction.rsplit("-", 2)[-2:]), kill.producer_epoch)]


def _transactions(batches: Any) -> list[tuple[int, str, int]]:
    """One producer id's transactions in log order: (the epoch its records carry, the marker
    that closed it or "" while open, its record count)."""
    found, epoch, waiting = [], None, 0
    for b in batches:
        if b.is_control:
            if epoch is not None:
                found.append((epoch, b.marker, waiting))
            epoch, waiting = None, 0
        else:
            epoch, waiting = b.producer_epoch, waiting + b.record_count
    if epoch is not None:
        found.append((epoch, "", waiting))
    return found


def marker_epochs(run: Any, bootstrap: str) -> list[tuple[str, str, int, int]]:
    """Each COMMIT or ABORT marker of the sink's transactions in the output's log, in order:
    (its transactional id's ``<subtask>-<checkpoint>``, the marker, the epoch of the records
    it closes, its own epoch). With transaction version 2 the coordinator bumps the
    producer's epoch as a transaction ends, so a marker's epoch is one above its records';
    classic transactions keep it (measured here: the commit a restored job makes of a
    completed checkpoint's transaction, through flink-connector-kafka's resumed producer,
    keeps it)."""
    with Inspector(bootstrap) as inspector:
        ids = {v[1]: t[len(run.prefix) + 1:] for t, v in inspector.listed_transactions().items()
               if t.startswith(run.prefix + "-")}
        o = inspector.offsets(run.topics["output"])[0]
        batches = inspector.batches(run.topics["output"], 0, o.log_start, o.high_watermark)
    open_epoch: dict[int, int] = {}  # producer id -> the epoch of its records not yet closed
    found = []
    for b in batches:
        if not b.is_control:
            open_epoch[b.producer_id] = b.producer_epoch
        elif b.producer_id in open_epoch and b.producer_id in ids:
            found.append((ids[b.producer_id], b.marker, open_epoch.pop(b.producer_id),
                          b.producer_epoch))
    return found


def summary(run: Any) -> str:
    f = run.facts
    hit = "; ".join(k.describe() for k in f["kills"]) or "no kill"
    return (f"{run.report.summary()}\nFlink {f['guarantee']}, checkpoints every "
            f"{f['checkpoint_interval_ms']} ms, transaction.timeout.ms "
            f"{f['transaction_timeout_ms']}: {hit}; down {f['down_s']} s; "
            f"{len(f['starts'])} starts; visible to read_committed after p50 "
            f"{f['latency']['p50_ms']:.0f} ms, p99 {f['latency']['p99_ms']:.0f} ms")


def to_dict(run: Any) -> dict:
    f = run.facts
    return {**run.report.to_dict(), "checkpoint_interval_ms": f["checkpoint_interval_ms"],
            "transaction_timeout_ms": f["transaction_timeout_ms"], "down_s": f["down_s"],
            "kills": [k.describe() for k in f["kills"]], "starts": len(f["starts"]),
            "restore_s": f["restore_s"], "latency": f["latency"],
            "transactions": {k: len(v) for k, v in f["transactions"].items()},
            "flink_said": f["flink_said"]}


def refusal_summary(run: Any) -> str:
    f = run.facts
    return (f"transaction.timeout.ms={f['transaction_timeout_ms']} against the broker's "
            f"transaction.max.timeout.ms={f['broker_max_ms']}: the job failed "
            f"{f['seconds']:.1f} s after its start: {f['flink_error']}\n{run.report.summary()}")


def refusal_to_dict(run: Any) -> dict:
    f = run.facts
    return {**run.report.to_dict(), **{k: f[k] for k in (
        "transaction_timeout_ms", "broker_max_ms", "seconds", "flink_error")}}
