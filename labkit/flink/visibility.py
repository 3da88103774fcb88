"""When each output record became visible to a read_committed reader, read from the log.

A transactional record is readable with read_committed from the moment the COMMIT marker of
its transaction is in its partition: the marker batch's timestamp is when the partition's
leader wrote it. A record written without a transaction (AT_LEAST_ONCE) is readable when
it is written: its batch's timestamp, when the output topic stamps the time it appended it
(``message.timestamp.type=LogAppendTime``, as the Flink experiments' output does: Flink's
sink would otherwise give each record its input record's timestamp). The latency of a
payment is the moment its first copy became visible minus the moment it was produced (its
input record's CreateTime).

    found = delays(bootstrap, "in", "out")
    quantiles(found)                  # {"p50_ms": 620.0, "p99_ms": 1130.0, "records": 400}
    quantiles(found, of="written")    # in the log (read_uncommitted) before: {"p50_ms": 40.0, ...}
"""
from __future__ import annotations

import statistics

from labkit.kafka import topics
from labkit.kafka.inspect.client import Inspector


def visible_at(bootstrap: str, topic: str) -> dict[tuple[int, int], int]:
    """(partition, offset) -> when it became readable with read_committed (ms), for every
    record of ``topic`` that did (records of aborted or open transactions never did)."""
    seen: dict[tuple[int, int], int] = {}
    with Inspector(bootstrap) as inspector:
        for partition, o in inspector.settled_offsets(topic).items():
            waiting: dict[int, list[tuple[int, int]]] = {}  # producer id -> open records
            for batch in inspector.batches(topic, partition, o.log_start, o.high_watermark):
                offsets = [(partition, off) for off in
                           range(batch.base_offset, batch.last_offset + 1)]
                if batch.is_control:
                    done = waiting.pop(batch.producer_id, [])
                    if batch.marker == "COMMIT":
                        seen.update((where, batch.max_timestamp) for where in done)
                elif batch.is_transactional:
                    waiting.setdefault(batch.producer_id, []).extend(offsets)
                else:
                    seen.update((where, batch.max_timestamp) for where in offsets)
    return seen


def delays(bootstrap: str, input_topic: str, output_topic: str
           ) -> dict[str, tuple[int, int, int]]:
    """payment id -> (produced ms, first visible ms, written ms) for every payment visible in
    the output (read_committed): its input record's CreateTime, its first visible copy's
    visibility, and when that copy was written into the log (its timestamp, the time the
    broker appended it when the output topic says LogAppendTime): from then on a
    read_uncommitted reader could read it."""
    born = {r.value["id"]: r.timestamp_ms for r in topics.read(bootstrap, input_topic)}
    visible = visible_at(bootstrap, output_topic)
    out: dict[str, tuple[int, int, int]] = {}
    for r in topics.read(bootstrap, output_topic):
        pid = r.value["id"]
        at = visible.get((r.partition, r.offset))
        if pid in born and at is not None and (pid not in out or at < out[pid][1]):
            out[pid] = (born[pid], at, r.timestamp_ms)
    return out


def quantiles(found: dict[str, tuple[int, ...]], visible_before_ms: float = float("inf"),
              of: str = "visible") -> dict[str, float]:
    """p50 and p99 of visible - produced (ms), over the payments visible before
    ``visible_before_ms`` (a run's first kill: the latency of a job running undisturbed);
    ``of="written"``: written - produced (in the log, not yet visible to read_committed);
    ``of="committing"``: visible - written (in the log, waiting for its transaction's
    commit)."""
    since, until = {"visible": (0, 1), "written": (0, 2), "committing": (2, 1)}[of]
    wait = sorted(t[until] - t[since] for t in found.values() if t[1] < visible_before_ms)
    if len(wait) < 2:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "records": len(wait)}
    q = statistics.quantiles(wait, n=100)
    return {"p50_ms": round(q[49], 1), "p99_ms": round(q[98], 1), "records": len(wait)}
