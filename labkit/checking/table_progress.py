"""An app's progress when it writes to a database: what it has consumed, as the database
or its group says, and how many rows it has written.

    watch = TableProgress(bootstrap, input_topic, group, db=dsn,
                          rows="SELECT COUNT(*) FROM payments",
                          positions="SELECT COALESCE(SUM(off), 0) FROM offsets WHERE topic = ?")
    consumed, end, written = watch.sample()

A consumer that keeps its offsets in the database, in the transaction of its rows, never
commits them to Kafka: its group's committed offsets stay at nothing however far it got, and
a judge that watched only them would wait for ever. Its progress is in its own offsets
table. ``positions`` is the query that sums the next offsets stored there for the input
topic (its one parameter); what the app has consumed is that sum or the group's committed
offsets, whichever is further, so one watch serves an app that keeps its offsets in Kafka,
one that keeps them in the database, and one that keeps them in both. ``rows`` counts what
it has written. Whether the group is waiting (a rebalance, a dead member) is asked of the
group coordinator as for any app (``GroupProgress.waiting``).
"""
from __future__ import annotations

from pathlib import Path

from labkit.checking.group_progress import GroupProgress
from labkit.storage.db import Database


class TableProgress(GroupProgress):
    def __init__(self, bootstrap: str, input_topic: str, group: str, *, db: str, rows: str,
                 positions: str | None = None, history_file: Path | None = None):
        super().__init__(bootstrap, input_topic, None, group, history_file=history_file)
        self.output = f"the database's rows ({rows})"
        self.rows_sql, self.positions_sql = rows, positions
        self.db = Database(db, readonly=True, timeout_s=5)

    def offsets_committed(self, ends: dict[tuple[str, int], int] | None = None) -> int:
        in_kafka = super().offsets_committed(ends)
        if self.positions_sql is None:
            return in_kafka
        (stored,), = self.db.query(self.positions_sql, (self.input,))
        return max(in_kafka, int(stored or 0))

    def written(self, ends: dict[tuple[str, int], int] | None = None) -> int:
        (count,), = self.db.query(self.rows_sql)
        return int(count)

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.db.close()
