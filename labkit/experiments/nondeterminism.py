"""Non-determinism on replay, the Kafka side: consume-transform-produce with a lookup that
changes while the worker is down.

The consume-transform-produce pipeline (labkit.pipelines.ctp) screens each batch with the
review threshold (labkit.pipelines.lookup), read when the batch is processed. The worker is
SIGKILLed after it produced its 2nd batch and before that batch's offsets were committed; while
it is down the threshold goes from V1 to V2; the restart processes that batch again, under V2.

- exactly_once: the killed attempt's transaction is aborted (the restart's
  init_transactions fences it), so a read_committed reader sees only the replay's output:
  one processing (``labkit.checking.checkers.single_processing``: mixed keys 0), while the log still
  holds the first attempt's records, aborted (``aborted_in_log`` > 0).
- at_least_once: the first attempt's output was delivered; the replay adds its own: payments
  with two different outcomes, no single processing (mixed keys > 0).

(labkit.spark.replay is the same experiment with Spark's sinks.)
"""
from __future__ import annotations

import tempfile
import uuid
import json
from dataclasses import dataclass, field
from pathlib import Path

from labkit.checking import checkers

from labkit.kafka import topics

from labkit.pipelines import data
from labkit.checking.audit import AuditReport, mixed_report
from labkit.checking.checkers import Result
from labkit.experiments.registry import REQUIRED, Experiment, Option, RunBasics, register
from labkit.faults.runner import run_worker
from labkit.pipelines import ctp
from labkit.pipelines.lookup import V1, V2, VERSION_FIELD, processing, set_threshold

# Where each guarantee's worker dies: its 2nd batch produced, its offsets not yet committed.
CRASH_AT = {"exactly_once": "after-send-offsets-before-commit",
            "at_least_once": "after-process-before-commit"}
CRASH_HIT, BATCH = 2, 10


@dataclass
class KafkaReplay(RunBasics):
    guarantee: str
    crash_at: str
    mixed: Result
    committed: list[tuple[str, str]]  # (id, threshold version) a read_committed reader gets
    aborted_in_log: int  # records in the output log that read_committed does not return
    produced: int = 0
    history: list[dict] = field(default_factory=list, repr=False)  # one worker: no events

    @property
    def report(self) -> AuditReport:
        return mixed_report("kafka-replay", self.guarantee, self.crash_at, self.produced,
                            [i for i, _ in self.committed], self.mixed)

    def to_json(self) -> str:
        return json.dumps({**self.report.to_dict(), "mixed_keys": self.mixed.count,
                           "aborted_in_log": self.aborted_in_log})

    def summary(self) -> str:
        """Stable text for notebooks and docs."""
        return (f"consume-transform-produce [{self.guarantee}]: {len(self.committed)} records "
                f"read_committed, {self.aborted_in_log} aborted in the log, {self.mixed.count} "
                f"mixed keys -> {'ONE processing' if self.mixed.valid else 'NO single processing'}")


def kafka_experiment(bootstrap: str, guarantee: str, records: int = 30) -> KafkaReplay:
    """Run the threshold pipeline under ``guarantee`` (exactly_once | at_least_once), crash it
    in its 2nd batch before the offsets are committed, lower the threshold while it is down,
    restart it, and audit the output topic (read_committed) for mixed attempts."""
    if guarantee not in CRASH_AT:
        raise ValueError(f"guarantee must be one of {', '.join(CRASH_AT)}, not {guarantee!r}")
    run_id = uuid.uuid4().hex[:8]
    in_topic, out_topic = f"replay-ctp-{run_id}-in", f"replay-ctp-{run_id}-out"
    inputs = data.generate(records, seed=0)
    data.load_into_topic(bootstrap, in_topic, inputs)
    topics.create(bootstrap, out_topic)
    with tempfile.TemporaryDirectory(prefix="labkit-lookup-") as work:
        lookup = str(Path(work) / "lookup.db")
        set_threshold(lookup, V1)
        run_worker(ctp.run, dict(bootstrap=bootstrap, input_topic=in_topic, output_topic=out_topic,
                                 group_id=f"replay-ctp-{run_id}",
                                 transactional_id=f"replay-ctp-{run_id}", guarantee=guarantee,
                                 batch_size=BATCH, lookup=lookup),
                   CRASH_AT[guarantee], CRASH_HIT, label=f"consume-transform-produce [{guarantee}]",
                   on_crash=lambda: set_threshold(lookup, V2))
    committed = topics.read(bootstrap, out_topic, isolation="read_committed")
    everything = topics.read(bootstrap, out_topic, isolation="read_uncommitted")
    seen = [(r.value["id"], r.value[VERSION_FIELD]) for r in committed]
    mixed = checkers.single_processing([(r["id"], r["key"]) for r in inputs], seen,
                                       [processing(inputs, V1), processing(inputs, V2)])
    topics.delete(bootstrap, in_topic, out_topic)
    return KafkaReplay(guarantee, CRASH_AT[guarantee], mixed, seen,
                       len(everything) - len(committed), len(inputs))


register(Experiment(
    "kafka-replay", "consume-transform-produce crashed in its 2nd batch while its lookup "
    "changes: does the output match one processing?",
    lambda context, guarantee, records: kafka_experiment(context.bootstrap, guarantee, records),
    options=(Option("guarantee", REQUIRED, "exactly_once | at_least_once", tuple(CRASH_AT),
                    short="-g"),
             Option("records", 30, "how many input records", kind=int, short="-n"))))
