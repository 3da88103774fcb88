"""The sink's ``transaction.timeout.ms`` against the broker's ``transaction.max.timeout.ms``.

The broker refuses a producer whose transaction timeout is above its maximum (15 min by
default) when the producer first asks for its id, so Flink's sink fails as it starts, in the
broker's words (InvalidTxnTimeoutException): the experiment ``flink-refused-start``. The
other side of the same setting, a timeout too short for the job's downtime, is
``flink-timeout-trap``: the broker aborts the pre-committed transaction and the restored job
cannot commit it.

    broker_max_timeout_ms(bootstrap)     # 900000
"""
from __future__ import annotations

from labkit.pipelines.share import broker_settings

MAX_SETTING = "transaction.max.timeout.ms"
# What the legacy FlinkKafkaProducer set by default (1 hour), which Flink's documentation
# warns is above the broker's default maximum.
LEGACY_FLINK_TIMEOUT_MS = 3_600_000


def broker_max_timeout_ms(bootstrap: str) -> int:
    """The broker's transaction.max.timeout.ms (DescribeConfigs)."""
    return int(broker_settings(bootstrap, (MAX_SETTING,))[MAX_SETTING])
