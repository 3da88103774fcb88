"""09 · the cost: the exercise check.

Every committed transaction writes one COMMIT marker into each partition it touched, and
a marker takes an offset. The learner predicts how many offsets a partition uses for
``records`` records at ``records_per_txn`` records per transaction; the check really
produces them with a transactional producer and asks the broker for the high watermark.
"""
from __future__ import annotations

import uuid

from labkit.cost import lane
from labkit.exercises import Verdict, check, exercise, unanswered
from labkit.kafka.inspect import Inspector

RECORDS = 1000
RECORDS_PER_TXN = 10
VALUE_BYTES = 100


def measured_high_watermark(bootstrap: str, records: int = RECORDS,
                            records_per_txn: int = RECORDS_PER_TXN) -> tuple[int, int]:
    """(high watermark, transactions) after producing ``records`` to a fresh topic."""
    topic = f"cost-exercise-{uuid.uuid4().hex[:8]}"
    m = lane.measure(bootstrap, "transactional", records, VALUE_BYTES,
                     records_per_txn=records_per_txn, topic=topic, warmup=False)
    with Inspector(bootstrap) as inspector:
        # the last COMMIT marker included
        return inspector.settled_offsets(topic)[0].high_watermark, m.transactions


@exercise("09_cost")
def check_offsets(bootstrap: str, high_watermark: int | None) -> Verdict:
    """09 · how many offsets do 1000 records in transactions of 10 use in one partition?"""
    if unanswered(high_watermark):
        return check(False, "", "fill in my_high_watermark, then run this cell again.")
    hw, txns = measured_high_watermark(bootstrap)
    return check(high_watermark == hw,
                 f"the broker reports high watermark {hw}: {RECORDS} records + {txns} COMMIT "
                 "markers. Each transaction costs at least one extra write per partition, "
                 "whatever its size: bigger transactions spread that cost thinner.",
                 f"the broker does not report high watermark {high_watermark}: it is "
                 f"{'lower' if hw < high_watermark else 'higher'}. Offsets start at 0; what "
                 "else besides the records does each committed transaction write into the "
                 "partition?")
