"""A running count per key, with a local state store backed by a changelog topic.

The Kafka Streams design, by hand: counts live in a local store (a SQLite file); every
change is also written to a compacted changelog topic, from which the store is rebuilt
when the local copy cannot be trusted. Each input record yields one output record
``{id, key, count}``. A checkpoint file says up to where the changelog is already in
the local store.

- at_most_once: commit the input offsets, *then* count and write.
- at_least_once: count (the store is updated on disk), write output and changelog, *then*
  commit the input offsets and the checkpoint. After a crash the store still holds the
  counts of the batch that is then processed again: the count over-counts.
- exactly_once (``processing.guarantee=exactly_once`` in Kafka Streams): output, changelog
  and input offsets commit in one transaction. While processing there is no checkpoint, so
  after a crash the store is wiped and rebuilt from the changelog read with read_committed:
  counts of an aborted batch are never seen.
"""
from __future__ import annotations

import json
from collections import Counter
from contextlib import closing
from pathlib import Path

from confluent_kafka import Consumer, Message, TopicPartition

from labkit.kafka import names, topics
from labkit.faults.crashpoints import crash_point
from labkit.pipelines.common import PIPELINE_TUNING, next_offsets, produce_in_halves, record_of
from labkit.pipelines.group import GroupInput, run_batches
from labkit.pipelines.guarantee import guarantee as guarantee_named
from labkit.storage.db import Database


class StateStore:
    """Counts per key in a SQLite file, plus the changelog checkpoint next to it."""

    def __init__(self, state_dir: str | Path):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_file = self.dir / "changelog.checkpoint"
        self.db = Database(self.dir / "counts.db", wal=True)
        self.db.execute("CREATE TABLE IF NOT EXISTS counts (key TEXT PRIMARY KEY, n INTEGER)")

    def get(self, key: str) -> int:
        row = self.db.query("SELECT n FROM counts WHERE key = ?", (key,))
        return row[0][0] if row else 0

    def put_all(self, values: dict[str, int]) -> None:
        with self.db.transaction():  # one SQLite transaction, durable once it returns
            self.db.executemany("INSERT INTO counts VALUES (?, ?) ON CONFLICT (key) "
                                "DO UPDATE SET n = excluded.n", list(values.items()))

    def wipe(self) -> None:
        self.db.execute("DELETE FROM counts")

    def checkpoint(self) -> int | None:
        if not self.checkpoint_file.exists():
            return None
        return json.loads(self.checkpoint_file.read_text())["changelog_offset"]

    def write_checkpoint(self, offset: int) -> None:
        tmp = self.checkpoint_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"changelog_offset": offset}))
        tmp.replace(self.checkpoint_file)

    def delete_checkpoint(self) -> None:
        self.checkpoint_file.unlink(missing_ok=True)

    def close(self) -> None:
        self.db.close()


def restore(store: StateStore, bootstrap: str, changelog_topic: str, isolation: str) -> None:
    """Bring the store up to the end of the changelog; without a checkpoint, from scratch."""
    start = store.checkpoint()
    if start is None:
        store.wipe()  # local contents of unknown age: trust only the changelog
        start = 0
    recs = [r for r in topics.read(bootstrap, changelog_topic, isolation=isolation)
            if r.offset >= start]
    store.put_all({r.key: r.value["count"] for r in recs})


def changelog_end(consumer: Consumer, changelog_topic: str) -> int:
    return consumer.get_watermark_offsets(TopicPartition(changelog_topic, 0), timeout=30,
                                          cached=False)[1]


def run(bootstrap: str, input_topic: str, output_topic: str, changelog_topic: str,
        group_id: str, transactional_id: str, state_dir: str, guarantee: str,
        batch_size: int = 10, restore_isolation: str | None = None,
        group_protocol: str = "classic", instance_id: str | None = None) -> None:
    """Count ``input_topic`` per key until its end; counts go to ``output_topic``.

    ``restore_isolation`` overrides how the changelog is read on restore (by default as the
    input is read); "read_uncommitted" under exactly_once is the mistake of restoring the
    counts of aborted transactions. One instance: the store holds every key's count.
    """
    g = guarantee_named(guarantee)
    output_topic, changelog_topic = names.topic(output_topic), names.topic(changelog_topic)
    with closing(StateStore(state_dir)) as store:
        out = g.open_output(bootstrap, transactional_id, PIPELINE_TUNING)  # fences first
        restore(store, bootstrap, changelog_topic, restore_isolation or g.isolation)
        if g.transactional:
            store.delete_checkpoint()  # a crash from here on means: rebuild from the changelog
        with closing(GroupInput(bootstrap, input_topic, group_id, g, protocol=group_protocol,
                                instance_id=instance_id)) as source:
            def process(batch: list[Message]) -> None:
                positions = next_offsets(batch)
                g.run_batch(out, lambda: _count(store, out, batch, output_topic, changelog_topic),
                            lambda: g.commit_offsets(out, source.consumer, positions))
                if not g.transactional:  # the store is trusted up to here after a restart
                    store.write_checkpoint(changelog_end(source.consumer, changelog_topic))

            run_batches(source, batch_size, process)
            store.write_checkpoint(changelog_end(source.consumer, changelog_topic))  # clean close


def _count(store: StateStore, out, batch: list[Message], output_topic: str,
           changelog_topic: str) -> None:
    counts: Counter[str] = Counter()
    outputs = []
    for msg in batch:
        rec = record_of(msg)
        key = rec["key"]
        if key not in counts:
            counts[key] = store.get(key)
        counts[key] += 1
        outputs.append((key, {"id": rec["id"], "key": key, "count": counts[key]}))
    store.put_all(dict(counts))
    crash_point("after-state-update-before-commit")
    # Output first, then the changelog, each flushed: a fixed order of produce requests
    # keeps network-fault experiments (drop the N-th produce ack) deterministic.
    produce_in_halves(out, output_topic, outputs)
    for key, n in sorted(counts.items()):
        out.produce(changelog_topic, key, {"key": key, "count": n})
    out.flush(60)
