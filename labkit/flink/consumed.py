"""Has a Flink job consumed its input and committed what it made of it? Read from Kafka and
the checkpoint folder, never from the job.

The job's source commits its offsets to Kafka when a checkpoint completes, but only once its
consumer's poll returns, which waits up to 10 s when no record comes (flink-connector-kafka
5.0's KafkaPartitionSplitReader polls for 10 s): after the input's end that commit lags by
up to 10 s. So the end is seen sooner from the output: the transform maps each payment to one
record in order, so once the sink has written (committed or not) a copy of the input's last
payment since this start began, the job has read everything; a checkpoint triggered after
that covers it, and once it has completed and no transaction is open in the output, the
output is final. The source's committed offset at the input's end also ends the wait (a
start that restored a checkpoint past the last payment has nothing left to write).
"""
from __future__ import annotations

import json

from labkit.flink import checkpoints
from labkit.kafka.inspect.client import Inspector


class EndWatch:
    def __init__(self, inspector: Inspector, source: str, sink: str, group: str,
                 root, output_from: int):
        self.inspector, self.source, self.sink, self.group = inspector, source, sink, group
        self.root = root
        self.position = output_from  # output offsets below this were written before this start
        self.last_id: str | None = None
        self.covering: int | None = None  # a checkpoint id that covers the last payment

    def _last_payment(self) -> str | None:
        end = self.inspector.offsets(self.source)[0].high_watermark
        for batch in reversed(self.inspector.batches(self.source, 0, max(0, end - 1), end)):
            for record in reversed(batch.records):
                return json.loads(record.value)["id"]
        return None

    def _written_since_start(self) -> bool:
        end = self.inspector.offsets(self.sink)[0].high_watermark
        found = False
        for batch in self.inspector.batches(self.sink, 0, self.position, end):
            if batch.is_control:
                continue
            found = found or any(r.value and json.loads(r.value).get("id") == self.last_id
                                 for r in batch.records)
        self.position = end
        return found

    def _committed_end(self) -> bool:
        ends = {p: o.high_watermark for p, o in self.inspector.offsets(self.source).items()}
        committed = self.inspector.group_offsets(self.source, [self.group]).get(self.group, {})
        return all(committed.get(p, -1) >= end for p, end in ends.items())

    def done(self) -> bool:
        """Call once the input is all produced, then until True."""
        if self.last_id is None:
            self.last_id = self._last_payment()
        if self.covering is None and self._written_since_start():
            listed = checkpoints.listed(self.root)
            self.covering = (max(c.id for c in listed) if listed else 0) + 1
        last = checkpoints.latest(self.root)
        covered = (self.covering is not None and last is not None and last.id >= self.covering)
        if not (covered or self._committed_end()):
            return False
        # looked at after the checkpoint: its transaction is committed once none is open
        return all(o.lso == o.high_watermark for o in self.inspector.offsets(self.sink).values())
