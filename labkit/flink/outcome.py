"""What a Flink job said and left behind: its error in its own words, the lines of its log
about transactions it could not commit, and its sink's transactions at the broker."""
from __future__ import annotations

import re
from pathlib import Path

from labkit.flink.process import JobProcess
from labkit.kafka.inspect.client import Inspector

# The coordinator's states a finished or abandoned transactional id rests in.
END_STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
              "CompleteAbort")
# Flink's KafkaCommitter logs these when a pre-committed transaction cannot be committed
# (flink-connector-kafka 5.0: "... In both cases this most likely signals data loss").
COMMIT_FAILED = re.compile(r"Unable to commit transaction|data has been potentially lost")


class FlinkJobError(RuntimeError):
    """A job that did not do what the run needed; the message ends with Flink's own words."""

    def __init__(self, job: JobProcess | None, what: str):
        said = flink_says(job) if job is not None else None
        tail = job.log_tail(15) if job is not None else ""
        super().__init__(f"{what}. Flink said: {said}" if said else
                         f"{what}. The job's last lines:\n{tail}")


def flink_says(job: JobProcess) -> str | None:
    """The root cause of the job's failure as Flink reported it ('Class: message'), or
    None while it runs or when it was killed."""
    outcome = job.outcome()
    if not outcome or outcome.get("ok"):
        return None
    causes = outcome.get("java") or []
    return causes[-1] if causes else outcome.get("error")


def commit_failures(run_dir: Path) -> list[str]:
    """Flink's own log lines, every start's, about transactions it could not commit."""
    found = []
    for log in sorted(run_dir.glob("*-flink/log/*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if COMMIT_FAILED.search(line):
                found.append(line.strip()[:1200])
    return found


def sink_transactions(inspector: Inspector, prefix: str) -> dict[str, list[str]]:
    """The sink's transactional ids (``prefix-...``) by their state at the coordinator now:
    CompleteCommit (committed), CompleteAbort (aborted: by a restored job, or by the broker
    when it timed out), Empty (opened for a checkpoint and never written)."""
    found: dict[str, list[str]] = {}
    for state in END_STATES:
        ids = [t for t in inspector.transactional_ids((state,)) if t.startswith(prefix + "-")]
        if ids:
            found[state] = sorted(ids, key=checkpoint_of)
    return found


def checkpoint_of(transactional_id: str) -> int:
    """The checkpoint a sink's transactional id (``<prefix>-<subtask>-<N>``) was opened for."""
    try:
        return int(transactional_id.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1
