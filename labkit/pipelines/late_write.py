"""The late write's producer, in both client families, as a process the experiment drives.

    python -m labkit.pipelines.late_write BOOTSTRAP TOPIC TRANSACTIONAL_ID produce|endtxn
    java -cp <kafka-clients 4.4> examples/late_write/LateWrite.java (the same arguments)

Both run one script, so the broker is the only difference between them:

  txn 1  one record, ``t1``; ``--hold produce``: its Produce is the request the proxy keeps,
         so the record times out and the app aborts txn 1 (the client's own rule);
         ``--hold endtxn``: its commit's EndTxn is kept, the client times it out, retries
         and the commit succeeds.
  txn 2  one record, ``t2``, acknowledged; the app says ``LABKIT {"event": "txn2-written"}``
         and waits for a line on stdin (meanwhile the experiment delivers the kept request);
         then it ends txn 2 the way the late request would not: it commits when the late
         request is txn 1's aborted record, it aborts when it is txn 1's commit.

Every step's outcome is a ``LABKIT {json}`` line on stdout (``ended``: what the app asked
for and the error it got, if any), the last one ``{"event": "done"}``. What the app
*meant*, set against what a read_committed reader sees, is the experiment's audit.

The timeouts are short so a run takes seconds: the client gives up on a request after
``REQUEST_TIMEOUT_MS`` and on a record after ``DELIVERY_TIMEOUT_MS``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from confluent_kafka import KafkaException, Producer, libversion

from labkit import settings
from labkit.kafka import jvm
from labkit.paths import project_root

CLIENTS = ("librdkafka", "java")
HOLDS = ("produce", "endtxn")
JAVA_APP = Path("examples") / "late_write" / "LateWrite.java"
REQUEST_TIMEOUT_MS = 2000
DELIVERY_TIMEOUT_MS = 2000  # equal: the first attempt's timeout ends the record (no retry)
CALL_TIMEOUT_S = 30.0  # every blocking call returns by then


def intended(hold: str) -> dict[str, str]:
    """How the script ends each transaction when nothing goes wrong on the wire: txn 1 is
    aborted when its record never arrives (``produce``), and txn 2 ends the other way."""
    return {"t1": "abort", "t2": "commit"} if hold == "produce" else \
        {"t1": "commit", "t2": "abort"}


def command(client: str, bootstrap: str, topic: str, transactional_id: str, hold: str) -> list[str]:
    """The producer's command line: this module under the lab's Python (librdkafka), or
    LateWrite.java by Java's single-file launcher (compiled in memory at each start) on the
    kafka-clients jar of the ``tools`` jars the lab fetches."""
    args = [bootstrap, topic, transactional_id, hold]
    if client == "librdkafka":
        return [sys.executable, "-m", "labkit.pipelines.late_write", *args]
    if client != "java":
        raise ValueError(f"client must be one of {', '.join(CLIENTS)}, not {client!r}")
    java = jvm.check_java()
    jvm.resolve("tools")
    return [java, "-Xmx256m", *settings.SHORT_LIVED_JVM.split(),
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp", str(jvm.jar_dir("tools") / "*"), str(project_root() / JAVA_APP), *args]


def say(event: str, **fields) -> None:
    print("LABKIT " + json.dumps({"event": event, **fields}), flush=True)


def record(txn: str) -> bytes:
    return json.dumps({"id": txn, "key": "k", "txn": txn}).encode()


def end(producer: Producer, txn: str, how: str) -> None:
    """Commit or abort as the client's classes say: a retriable error is retried, an
    abortable one aborts, a fatal one ends the producer (reported, not raised)."""
    error = retried = None
    for _ in range(3):
        try:
            (producer.commit_transaction if how == "commit" else producer.abort_transaction)(CALL_TIMEOUT_S)
            error, retried = None, error  # a retried call that succeeded ended it
            break
        except KafkaException as exc:
            kafka_error = exc.args[0]
            error = f"{kafka_error.name()}: {kafka_error.str()}"
            if kafka_error.fatal():
                say("ended", txn=txn, asked=how, error=error, fatal=True)
                raise
            if kafka_error.txn_requires_abort() and how == "commit":
                how = "abort"  # the client's rule: an abortable error aborts
            elif not kafka_error.retriable():
                break
    say("ended", txn=txn, asked=how, error=error, retried_after=retried)


def main(bootstrap: str, topic: str, transactional_id: str, hold: str) -> None:
    producer = Producer({
        "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
        "request.timeout.ms": REQUEST_TIMEOUT_MS, "socket.timeout.ms": REQUEST_TIMEOUT_MS,
        "message.timeout.ms": DELIVERY_TIMEOUT_MS, "transaction.timeout.ms": 60_000,
        "linger.ms": 0})
    reports: list[str | None] = []
    producer.init_transactions(CALL_TIMEOUT_S)
    say("ready", client=f"librdkafka {libversion()[0]}")
    plan = intended(hold)
    for txn in ("t1", "t2"):
        producer.begin_transaction()
        producer.produce(topic, key=b"k", value=record(txn),
                         on_delivery=lambda err, msg: reports.append(err and err.name()))
        producer.flush(CALL_TIMEOUT_S)
        say("written", txn=txn, error=reports[-1] if reports else "no report")
        if txn == "t2":
            say("txn2-written")
            sys.stdin.readline()  # the experiment delivers the kept request meanwhile
        end(producer, txn, plan[txn])
    say("done")


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[4] not in HOLDS:
        sys.exit(f"usage: python -m labkit.pipelines.late_write BOOTSTRAP TOPIC "
                 f"TRANSACTIONAL_ID {'|'.join(HOLDS)}")
    main(*sys.argv[1:])
