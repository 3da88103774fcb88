"""The late write: a transactional request delivered after its client gave up on it.

    run = experiments.run("late-write", client="librdkafka", hold="endtxn")
    run.late["accepted"], run.late["error"]   # True, None: txn 1's commit ended txn 2
    run.report.aborted_visible                # 1: the record the app aborted is readable
    experiments.run("late-write", client="java", hold="endtxn").late["error"]  # PRODUCER_FENCED

Jepsen's analysis of Kafka's transaction protocol (2024, KAFKA-17754): a request delayed in
the network can land after its transaction ended, inside the producer's next one. The
producer (``labkit.pipelines.late_write``: librdkafka, the classic protocol; or the Java
client 4.4, transaction version 2) runs two transactions of one record each through the
lab's proxy, which keeps its first Produce (``--hold produce``) or its first EndTxn
(``--hold endtxn``) and stalls that connection, so the client's own request timeout ends
the wait (``labkit.faults.late``). Once txn 2's record is acknowledged the kept request
reaches the broker; then the app ends txn 2 the other way.

Everything the audit says is read from the broker: what a read_committed reader sees
against what the app committed or aborted (aborted reads, lost writes), every batch and
marker of the log with its producer id and epoch (which transaction each record landed
in), and the broker's answer to the late request as the proxy saw it.
"""
from __future__ import annotations

import json
import queue
import subprocess
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from labkit import proc
from labkit.checking import audit, history, reads
from labkit.checking.checks import Counted
from labkit.checking.record import Presentation
from labkit.experiments.parts import Topic, Workload, in_thread
from labkit.experiments.registry import Experiment, Option, register
from labkit.faults.late import LateRequest
from labkit.faults.nemesis import Nemesis, Observe, on
from labkit.kafka import protocol, topics
from labkit.kafka.inspect import Inspector, parse_batches
from labkit.pipelines import late_write

SCENARIO = "late-write"
API = {"produce": "Produce", "endtxn": "EndTxn"}
TRACED = {"InitProducerId", "AddPartitionsToTxn", "Produce", "EndTxn"}
CLIENT_TIMEOUT_S = 90.0  # a client silent this long is stopped (Java's start takes ~3 s)
PROTOCOL = {"librdkafka": "classic transaction protocol", "java": "transaction version 2"}
SAID = "said"  # the history entry of one of the app's LABKIT lines


def drive(run: Any) -> None:
    """The producer as a process: its ``LABKIT`` lines become the run's events (the kept
    request is delivered on ``txn2-written``, then the producer is told to go on)."""
    o = run.o
    command = late_write.command(o.client, run.client_bootstrap, run.topics["output"],
                                 run.transactional_id(), o.hold)
    with open(run.workdir / "client.err", "w+", encoding="utf-8") as stderr:
        app = proc.spawn(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=stderr, text=True)
        try:
            said = _follow(run, app, stderr)
            code = app.wait(CLIENT_TIMEOUT_S)
        finally:
            proc.stop([app], timeout_s=5)  # on every path: no producer outlives its run
        if not any(e["event"] == "done" for e in said) and not _fatal(said):
            raise RuntimeError(f"the {o.client} producer exited {code} before its script "
                               f"ended; its stderr: {_tail(stderr)}")


def _follow(run: Any, app: subprocess.Popen, stderr: Any) -> list[dict]:
    """The producer's ``LABKIT`` lines, each reported as the run's event, until it exits."""
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, app.stdout), lines.put(None)],
                     daemon=True, name="late-write-client").start()
    said: list[dict] = []
    with run.status(f"{run.o.client}: two transactions, its first {API[run.o.hold]} kept"):
        while True:
            try:
                line = lines.get(timeout=CLIENT_TIMEOUT_S)
            except queue.Empty:
                raise TimeoutError(f"the {run.o.client} producer said nothing for "
                                   f"{CLIENT_TIMEOUT_S:.0f} s; its stderr: {_tail(stderr)}") from None
            if line is None:
                return said
            if not line.startswith("LABKIT "):
                continue
            said.append(event := json.loads(line[len("LABKIT "):]))
            # the app's own account joins the run's history as it happens: the audit reads
            # what the app believes from there, live and in a stored run alike
            history.append(run.history_file, SAID, said=event)
            # txn2-written fires the LateRequest fault here, in this thread: the kept
            # request has reached the broker before the producer is told to go on
            run.event(event["event"], **{k: v for k, v in event.items() if k != "event"})
            if event["event"] == "txn2-written":
                app.stdin.write("go\n")
                app.stdin.flush()


def _fatal(said: list[dict]) -> bool:
    return any(e.get("fatal") for e in said)


def _tail(stderr: Any) -> str:
    stderr.flush()
    stderr.seek(0)
    return stderr.read()[-2000:] or "(empty)"


def client_said(events: list[dict]) -> list[dict]:
    """The app's ``LABKIT`` lines, in order, as the run's history keeps them."""
    return [e["said"] for e in events if e.get("kind") == SAID]


def outcomes(said: list[dict]) -> dict[str, str]:
    """What the app believes of each transaction: 'committed' when it asked to commit and
    heard no error, else 'aborted' (asked to abort, or its commit failed)."""
    ended = {e["txn"]: e for e in said if e["event"] == "ended"}
    return {txn: "committed" if e["asked"] == "commit" and not e.get("error") else "aborted"
            for txn, e in ended.items()}


def log_transactions(bootstrap: str, topic: str) -> list[dict]:
    """Each record of the log with the transaction it landed in, as the broker's batches
    say: producer id and epoch of its batch, and the first marker after it of that producer
    (COMMIT or ABORT, the marker's epoch; None while open)."""
    with Inspector(bootstrap) as inspector:
        offsets = inspector.offsets(topic)[0]
        batches = inspector.batches(topic, 0, offsets.log_start, offsets.high_watermark)
    out = []
    for b in batches:
        if b.is_control:
            continue
        marker = next((m for m in batches if m.is_control and m.producer_id == b.producer_id
                       and m.base_offset > b.last_offset), None)
        for r in b.records:
            out.append({"id": topics.decode(r.value)["id"], "offset": r.offset,
                        "producer_id": b.producer_id, "producer_epoch": b.producer_epoch,
                        "sequence": b.base_sequence,
                        "marker": marker.marker if marker else None,
                        "marker_offset": marker.base_offset if marker else None,
                        "marker_epoch": marker.producer_epoch if marker else None})
    return out


def log_entries(bootstrap: str, topic: str) -> list[dict]:
    """Every batch of the log in order, data and markers alike: its offset, what it is (a
    record's id, or COMMIT / ABORT for a marker) and its producer epoch."""
    with Inspector(bootstrap) as inspector:
        offsets = inspector.offsets(topic)[0]
        batches = inspector.batches(topic, 0, offsets.log_start, offsets.high_watermark)
    return [{"offset": b.base_offset, "producer_epoch": b.producer_epoch,
             "entry": f"{b.marker} marker" if b.is_control else
             ", ".join(f"record {topics.decode(r.value)['id']}" for r in b.records)}
            for b in batches]


def carried(exchange: dict) -> dict:
    """What the late request itself said, decoded from its bytes: a Produce's record batch
    (producer id, epoch, sequence, record ids), an EndTxn's producer id, epoch and verdict."""
    _, body = protocol.decode_request(exchange["request"])
    if exchange["api"] == "EndTxn":
        return {"producer_id": int(body.producer_id), "producer_epoch": int(body.producer_epoch),
                "committed": bool(body.committed)}
    (batch,) = [b for t in body.topic_data for p in t.partition_data
                for b in parse_batches(p.records or b"", int(p.index))]
    return {"producer_id": batch.producer_id, "producer_epoch": batch.producer_epoch,
            "sequence": batch.base_sequence,
            "records": [topics.decode(r.value)["id"] for r in batch.records]}


def broker_then(run: Any) -> dict:
    """What the broker holds as the late request is about to arrive (txn 2 open, its record
    written): the coordinator's transaction (state, producer epoch) and the output
    partition's producer epoch (DescribeProducers). A late request carrying an older epoch
    than these is refused; one carrying the same is taken for txn 2's."""
    with Inspector(run.bootstrap) as inspector:
        (txn,) = inspector.describe_transactions([run.transactional_id()])
        partition = [p.producer_epoch for p in inspector.producers(run.topics["output"])
                     if p.producer_id == txn.producer_id]
    return {"broker_then": {"coordinator_state": txn.state, "coordinator_epoch": txn.producer_epoch,
                            "partition_epoch": partition[0] if partition else None}}


@dataclass(frozen=True)
class LateAudit:
    """The app's intent against a read_committed reader: a record of a transaction the app
    committed and cannot read is lost, one it aborted and can read is an aborted read. The
    intent is the app's lines in the history, the output a ``reads.topic`` read."""

    hold: str

    # both come from the history: a stored run re-checks it
    replayable: ClassVar[bool] = True

    def __call__(self, run: Any) -> Counted:
        believed = outcomes(client_said(reads.events(run)))
        visible = audit.delivered_of(reads.topic(run, "output").committed)
        committed = [{"id": txn, "key": "k"} for txn, how in believed.items()
                     if how == "committed"]
        report = audit.check(SCENARIO, "exactly_once", committed, visible,
                             fault=f"the first {API[self.hold]} delivered late",
                             aborted=[d for d in visible if believed.get(d.id) != "committed"])
        return Counted(report, {"read_committed": [d.id for d in visible]})


def facts(run: Any) -> dict:
    (late,) = run.nemesis.of(LateRequest)
    said = client_said(reads.events(run))
    if late.exchange is None:
        raise RuntimeError(f"the kept {late.api} was never delivered (the producer did not "
                           f"reach txn 2); proxy counters: {run.facts.get('fault_stats')}")
    return {"late": {"api": late.api, "version": late.exchange["version"],
                     "accepted": late.exchange["error"] is None,
                     "error": late.exchange["error"], "kept_s": late.exchange["kept_s"],
                     "carried": carried(late.exchange)},
            "protocol": PROTOCOL[run.o.client],
            "client": next(e.get("client") for e in said if e["event"] == "ready"),
            "client_said": said, "believed": outcomes(said),
            "client_errors": {e["txn"]: e["error"] for e in said
                              if e["event"] in ("written", "ended") and e.get("error")},
            "log": log_transactions(run.bootstrap, run.topics["output"]),
            "batches": log_entries(run.bootstrap, run.topics["output"]),
            "wire": [{k: e.get(k) for k in ("api", "version", "error", "producer_epoch", "late")}
                     for e in late.exchanges]}


def summary(run: Any) -> str:
    late = run.late
    verdict = "ACCEPTED" if late["accepted"] else f"REFUSED with {late['error']}"
    lines = [f"{run.options['client']} ({run.protocol}): the late {late['api']} v{late['version']} "
             f"(kept {late['kept_s']:.1f} s, epoch {late['carried']['producer_epoch']}) was "
             f"{verdict}; the broker then: {run.broker_then}",
             f"the app believes: {run.believed}; its errors: {run.client_errors or 'none'}",
             "the log: " + "; ".join(
                 f"{r['id']}@{r['offset']} pid {r['producer_id']} epoch {r['producer_epoch']} "
                 f"-> {r['marker']} (epoch {r['marker_epoch']})" for r in run.log),
             run.report.summary()]
    return "\n".join(lines)


register(Experiment(
    SCENARIO, "a transactional request delivered after its client gave up on it: does it "
    "land in the next transaction?", options=(
        Option("client", "librdkafka", "the producer: librdkafka (classic transaction "
               "protocol) or the Java client 4.4 (transaction version 2)",
               choices=late_write.CLIENTS),
        Option("hold", "endtxn", "the request kept and delivered late: txn 1's Produce or "
               "its commit (EndTxn)", choices=late_write.HOLDS)),
    workload=lambda o: Workload("late-write", (Topic("output"),), []),
    clients=in_thread(drive),
    nemesis=lambda o: Nemesis(  # in this order: the look comes before the delivery
        Observe(on("txn2-written"), broker_then, name="the broker before the late request"),
        LateRequest(API[o.hold], on("txn2-written"), trace_apis=TRACED)),
    checkers=lambda o: [LateAudit(o.hold)],
    facts=facts,
    presentation=Presentation(summary=summary, json_facts=(
        "client", "protocol", "late", "broker_then", "believed", "client_errors",
        "read_committed", "log", "batches", "wire"))))
