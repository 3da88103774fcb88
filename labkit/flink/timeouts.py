"""The sink's ``transaction.timeout.ms`` against the broker's ``transaction.max.timeout.ms``.

The broker refuses a producer whose transaction timeout is above its maximum (15 min by
default) when the producer first asks for its id, so Flink's sink fails as it starts, in the
broker's words (InvalidTxnTimeoutException). The other side of the same setting, a timeout
too short for the job's downtime, is ``supervised.run(..., kills=["before-commit"],
transaction_timeout_ms=..., down_s=...)``: the broker aborts the pre-committed transaction
and the restored job cannot commit it.

    refusal = refused_start(bootstrap, transaction_timeout_ms=3_600_000)
    refusal.broker_max_ms      # 900000
    refusal.flink_error        # 'org.apache.kafka.common.errors.InvalidTxnTimeoutException: ...'
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from labkit.flink.outcome import FlinkJobError, flink_says
from labkit.flink.runsetup import START_S, RunSetup
from labkit.kafka import topics
from labkit.pipelines.share import broker_settings

MAX_SETTING = "transaction.max.timeout.ms"
# What the legacy FlinkKafkaProducer set by default (1 hour), which Flink's documentation
# warns is above the broker's default maximum.
LEGACY_FLINK_TIMEOUT_MS = 3_600_000


def broker_max_timeout_ms(bootstrap: str) -> int:
    """The broker's transaction.max.timeout.ms (DescribeConfigs)."""
    return int(broker_settings(bootstrap, (MAX_SETTING,))[MAX_SETTING])


@dataclass(frozen=True)
class Refusal:
    transaction_timeout_ms: int
    broker_max_ms: int
    flink_error: str  # the root cause, as the job's failure reported it
    seconds: float  # the start to the failure

    def summary(self) -> str:
        return (f"transaction.timeout.ms={self.transaction_timeout_ms} against the broker's "
                f"{MAX_SETTING}={self.broker_max_ms}: the job failed {self.seconds:.1f} s "
                f"after its start: {self.flink_error}")


def refused_start(bootstrap: str, transaction_timeout_ms: int = LEGACY_FLINK_TIMEOUT_MS, *,
                  function: str = "fee_job", job_file: Path | None = None,
                  job_code: str | None = None) -> Refusal:
    """Start the job (exactly once) with ``transaction_timeout_ms`` and return how it
    failed. Raises FlinkJobError if it did not fail (it completed a checkpoint)."""
    broker_max = broker_max_timeout_ms(bootstrap)
    r = RunSetup(bootstrap, "exactly_once", 1000, transaction_timeout_ms, function, job_file,
                 job_code)
    topics.create(bootstrap, r.source, r.sink)
    try:
        job, _ = r.start()
        with job:
            code = job.wait(START_S)
            if code is None or code == 0:
                raise FlinkJobError(job, f"transaction.timeout.ms={transaction_timeout_ms} "
                                         f"(broker maximum {broker_max}) was not refused")
            said = flink_says(job) or job.log_tail(5)
            took = time.monotonic() - job.started
    finally:
        topics.delete(bootstrap, r.source, r.sink)
        r.remove()
    return Refusal(transaction_timeout_ms, broker_max, said, round(took, 1))
