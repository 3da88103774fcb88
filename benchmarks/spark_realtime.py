"""Spark's real-time mode against a micro-batch trigger: latency, and what one driver crash
writes twice (issue 30).

    python benchmarks/spark_realtime.py                    # a lab of its own, or LABKIT_BOOTSTRAP
    python benchmarks/spark_realtime.py --rate 100 --seconds 30 --kill-after 13

For each trigger (a micro-batch default, then `trigger(realTime=...)` with 5, 10 and 20 s
batch durations): a producer writes `rate` records a second with unique keys; the same
Kafka-to-Kafka query (the official source and sink, QUERY below) copies them; the driver
(Python and its JVM) is SIGKILLed `kill-after` seconds after its first output, restarted
on the same checkpoint, and stopped once every input key is out. The audit reads both
topics: latency is a record's output CreateTime minus its input CreateTime (one clock, one
machine), over the records copied before the kill; duplicated is output records minus
distinct keys. One crash per trigger: the duplicates are one sample of the replay window,
shown beside how long the killed driver had run since its last checkpoint (the newest file
in the checkpoint's commits/).
Prints markdown rows for docs/measurements.md.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from labkit import proc
from labkit.kafka import cluster, names, topics

# The learner's query, as a child process runs it: read a topic, write a topic, one trigger.
QUERY = """
import sys, time
from labkit.spark.session import session
bootstrap, source, sink, checkpoint, trigger = sys.argv[1:6]
spark = session("realtime-bench", local=True)
rows = (spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source).option("startingOffsets", "earliest").load())
writer = (rows.selectExpr("key", "value").writeStream.format("kafka")
          .option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
          .option("checkpointLocation", checkpoint).outputMode("update"))
if trigger != "micro-batch":
    writer = writer.trigger(realTime=trigger)
query = writer.start()
print("started", flush=True)
query.awaitTermination()
"""

# Real-time batches last at least 5 s (spark.sql.streaming.realTimeMode.minBatchDuration:
# Spark 4.2 refuses "2 seconds" with INVALID_STREAMING_REAL_TIME_MODE_TRIGGER_INTERVAL).
TRIGGERS = ("micro-batch", "5 seconds", "10 seconds", "20 seconds")


def produce(bootstrap: str, topic: str, rate: int, seconds: float) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    sent, start = 0, time.monotonic()
    while sent < rate * seconds:
        due = start + sent / rate
        time.sleep(max(0.0, due - time.monotonic()))
        producer.produce(topic, key=f"k{sent:06d}", value=json.dumps({"id": sent}))
        producer.poll(0)
        sent += 1
    producer.flush(30)


def read_all(bootstrap: str, topic: str, partitions: int) -> list[tuple[str, int]]:
    """(key, CreateTime ms) of every record, read_uncommitted (Spark's sink writes no
    transactions)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "realtime-bench",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, pending, deadline = [], set(range(partitions)), time.monotonic() + 60
    try:
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.2):
                if msg.error() is None:
                    out.append((msg.key().decode(), msg.timestamp()[1]))
                elif msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
    finally:
        consumer.close()
    return out


def start_driver(bootstrap: str, source: str, sink: str, checkpoint: str,
                 trigger: str) -> subprocess.Popen:
    with open(f"{checkpoint}.log", "a") as log:  # Spark's error, if the query fails
        return proc.spawn([sys.executable, "-c", QUERY, bootstrap, source, sink, checkpoint,
                           trigger], stdout=log, stderr=subprocess.STDOUT)


def failure(checkpoint: str) -> str:
    lines = Path(f"{checkpoint}.log").read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines if "Exception" in line or "Error" in line)[-1500:]


def count_out(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "realtime-bench-count"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(partitions))
    finally:
        consumer.close()


def one_run(bootstrap: str, trigger: str, rate: int, seconds: float, kill_after: float,
            partitions: int = 2) -> dict:
    tag = uuid.uuid4().hex[:6]
    topics.create(bootstrap, f"rt-in-{tag}", f"rt-out-{tag}", partitions=partitions)
    source, sink = names.topic(f"rt-in-{tag}"), names.topic(f"rt-out-{tag}")
    checkpoint = tempfile.mkdtemp(prefix="rt-ckpt-")
    driver = start_driver(bootstrap, source, sink, checkpoint, trigger)
    started = time.time()
    producer = threading.Thread(target=produce, args=(bootstrap, source, rate, seconds))
    try:
        producer.start()
        deadline = time.monotonic() + 120
        while count_out(bootstrap, sink, partitions) == 0:
            if time.monotonic() > deadline or driver.poll() is not None:
                raise RuntimeError(f"{trigger}: no output (driver exit code {driver.poll()}):\n"
                                   f"{failure(checkpoint)}")
            time.sleep(0.2)
        first_out, first_out_ms = time.monotonic(), time.time() * 1000
        time.sleep(kill_after)
        killed_at_ms = time.time() * 1000
        gone = proc.kill([driver])  # the driver's Python and its JVM, at once
        commits = [f.stat().st_mtime for f in Path(checkpoint, "commits").glob("[0-9]*")]
        # how long the killed driver had run since its last checkpoint: its replay window
        since_checkpoint = killed_at_ms / 1000 - max(commits, default=started)
        out_at_kill = count_out(bootstrap, sink, partitions)
        print(f"  {trigger}: driver SIGKILLed {kill_after} s after its first output "
              f"(gone: {gone}), {out_at_kill} records out by then", file=sys.stderr, flush=True)
        driver = start_driver(bootstrap, source, sink, checkpoint, trigger)
        producer.join()
        expected = int(rate * seconds)
        deadline = time.monotonic() + 180
        while len({k for k, _ in read_all(bootstrap, sink, partitions)}) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{trigger}: the restarted driver did not copy every record")
            time.sleep(1)
        elapsed = time.monotonic() - first_out
    finally:
        proc.stop([driver], timeout_s=5)
        producer.join()
        shutil.rmtree(checkpoint, ignore_errors=True)
        Path(f"{checkpoint}.log").unlink(missing_ok=True)
    born = dict(read_all(bootstrap, source, partitions))
    out = read_all(bootstrap, sink, partitions)
    first: dict[str, int] = {}
    for key, ts in out:
        first[key] = min(ts, first.get(key, ts))
    # steady state: records born after the first output, copied before the kill
    before_kill = sorted(ts - born[k] for k, ts in first.items()
                         if born[k] > first_out_ms and ts < killed_at_ms)
    stamps = sorted(ts for _, ts in out)
    gap = max((b - a for a, b in zip(stamps, stamps[1:])), default=0)
    topics.delete(bootstrap, f"rt-in-{tag}", f"rt-out-{tag}")
    # too short a run may copy nothing between the first output and the kill: no latency
    q = statistics.quantiles(before_kill, n=100) if len(before_kill) > 1 else [None] * 99
    return {"trigger": trigger, "records": len(born), "out": len(out),
            "duplicated": len(out) - len(first), "lost": len(set(born) - set(first)),
            "p50_ms": q[49] and round(q[49]), "p99_ms": q[98] and round(q[98]), "seconds": round(elapsed), "out_gap_s": round(gap / 1000, 1),
            "since_checkpoint_s": round(since_checkpoint, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=100, help="records a second")
    parser.add_argument("--seconds", type=float, default=30, help="how long the producer writes")
    parser.add_argument("--kill-after", type=float, default=13,
                        help="seconds after the first output when the driver is SIGKILLed")
    parser.add_argument("--triggers", nargs="*", default=list(TRIGGERS))
    args = parser.parse_args()
    lab = cluster.ensure()
    print("| trigger | records | killed, s after the last checkpoint | duplicated | lost | "
          "latency p50 / p99 ms | output stopped |")
    print("|---|---|---|---|---|---|---|")
    for trigger in args.triggers:
        row = one_run(lab.bootstrap, trigger, args.rate, args.seconds, args.kill_after)
        print(f"| {row['trigger']} | {row['records']} | {row['since_checkpoint_s']} | "
              f"{row['duplicated']} | {row['lost']} | "
              f"{row['p50_ms']} / {row['p99_ms']} | {row['out_gap_s']} s |", flush=True)


if __name__ == "__main__":
    main()
