"""Non-determinism on replay: the replayed batch is computed with a lookup that changed.

Exactly once means the output equals *one* processing of each record. Idempotent writes
assume the replay computes the same thing as the first attempt; a transform that looks
something up (or reads a clock) does not. Here payments above a review threshold are held
for review (not written), and the threshold lives in a table risk operations edit
(labkit.pipelines.lookup): the lookup happens when a micro-batch is processed, and each written
row says which threshold let it through (``threshold_version`` in its value).

The experiment is fixed by construction: the threshold is ``V1`` (everything passes) until
the query is SIGKILLed between its sink and Spark's commit log in the 2nd micro-batch; while
it is down the threshold is lowered to ``V2``; the restart replays that batch under ``V2``.

- the idempotent (upsert) sink keeps the first attempt's rows that ``V2`` holds back and
  overwrites the others: output of two attempts mixed, per key, matching no single processing
  (``labkit.checking.checkers.single_processing``: mixed keys > 0);
- the transactional sink (offsets in the database) and Delta's txnVersion skip the replay:
  the batch stays as its first attempt wrote it, one processing (mixed keys 0);
- a plain Delta append (``delta-append``) adds the replay's rows next to the first
  attempt's: some payments twice, with two different outcomes (no single processing).
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from labkit.checking import checkers

from labkit.kafka import names

from labkit.pipelines import data, learner
from labkit.checking.audit import AuditReport, mixed_report
from labkit.checking.checkers import Result
from labkit.spark import check, tables
from labkit.pipelines.lookup import V1, V2, VERSION_FIELD, processing, set_threshold
from labkit.storage.db import default_url
from labkit.spark.child import TRANSFORM_PROVIDES
from labkit.spark.runner import StreamJob
from labkit.spark.supervised import Run, run_until_done
from labkit.spark.sinks import DELTA_KINDS, SinkSpec

SINKS = ("idempotent", "transactional", "delta", "delta-append")
CRASH_AT, CRASH_HIT, BATCHES, PARTITIONS = "spark-after-sink-before-commit", 2, 3, 2


def observed(output: pd.DataFrame) -> list[tuple[str, str]]:
    """(id, threshold version) of every output row, duplicates included."""
    values = [json.loads(v) for v in output["value"]]
    if untagged := [i for i, v in zip(output["id"], values) if VERSION_FIELD not in v]:
        raise learner.LearnerCodeError(
            f"{len(untagged)} rows were written without {VERSION_FIELD!r} in their value (e.g. "
            f"{untagged[0]}): the audit reads it, so the transform must tag each row it keeps")
    return [(i, v[VERSION_FIELD]) for i, v in zip(output["id"], values)]


def audit(inputs: list[dict], output: pd.DataFrame) -> Result:
    """Mixed keys: keys whose rows match no single processing under V1-then-V2."""
    return checkers.single_processing([(r["id"], r["key"]) for r in inputs], observed(output),
                                      [processing(inputs, V1), processing(inputs, V2)])


@dataclass
class ReplayExperiment:
    sink: str
    mixed: Result
    output: pd.DataFrame  # the sink's rows (the table as the audit read it)
    run: Run
    inputs: list[dict]
    workdir: Path
    history: pd.DataFrame | None = None  # the Delta sink's DESCRIBE HISTORY + txn entries

    def versions_by_position(self) -> pd.DataFrame:
        """Per input partition and threshold version: how many rows, and the input offsets
        they span (what the table shows: the offsets are columns the sink writes). One
        processing with one change gives, per partition, V1 offsets all below V2 offsets;
        overlapping spans are two attempts mixed."""
        tags = [v for _, v in observed(self.output)]
        frame = self.output.assign(threshold_version=tags)
        return (frame.groupby(["kafka_partition", "threshold_version"])["kafka_offset"]
                .agg(rows="size", first_offset="min", last_offset="max").reset_index())

    def summary(self) -> str:
        """Stable text for notebooks: the sink, its row count and the mixed keys."""
        return (f"{self.sink}: {len(self.output)} rows, {self.mixed.count} mixed keys"
                f" -> {'matches ONE processing' if self.mixed.valid else 'matches NO single processing'}")

    @property
    def report(self) -> AuditReport:
        """The one audit: a mixed key is a drifted key of the computed state."""
        guarantee = "at_least_once" if self.sink == "delta-append" else "exactly_once"
        return mixed_report(f"spark-replay [{self.sink}]", guarantee, CRASH_AT,
                            len(self.inputs), [i for i, _ in observed(self.output)], self.mixed)

    @property
    def topics(self) -> dict[str, str]:
        return {"input": self.run.job.topic}

    def to_json(self) -> str:
        return json.dumps({**self.report.to_dict(), "mixed_keys": self.mixed.count})

    def timeline(self) -> str:
        return self.run.timeline.to_string(index=False)

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def experiment(bootstrap: str, sink: str, records: int = 60, *,
               workdir: str | Path | None = None,
               on_event: Callable[[dict], None] | None = None,
               spare: bool = True,
               transform: Callable[..., list[dict]] | None = None) -> ReplayExperiment:
    """Run the threshold pipeline into ``sink`` (one of SINKS), crash it
    between its sink and the commit log in the 2nd micro-batch, lower the threshold while it
    is down, restart it, and audit the output for mixed attempts.

    ``transform``: the learner's function for each micro-batch's rows (it may name ``rows``,
    the batch's rows as dicts, and ``threshold_table``, the lookup's SQLite file) returning
    the rows to write; without it, the lab's ``lookup.apply_threshold``."""
    if sink not in SINKS:
        raise ValueError(f"unknown sink {sink!r} for the replay experiment; valid: {', '.join(SINKS)}")
    transform_code = None
    if transform is not None:
        learner.check_parameters(transform, TRANSFORM_PROVIDES)
        transform_code = {"code": learner.code_of(transform), "function": transform.__name__}
    workdir = Path(workdir or tempfile.mkdtemp(prefix="labkit-replay-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    topic = names.topic(f"replay-{sink}-{run_id}-in")  # Spark subscribes to the broker's name
    inputs = data.generate(records, seed=0)
    data.load_into_topic(bootstrap, topic, inputs, partitions=PARTITIONS)
    lookup = str((workdir / "lookup.db").resolve())
    set_threshold(lookup, V1)
    table = f"{sink.replace('-', '_')}_{run_id}"
    spec = (SinkSpec(sink, table=table, path=str(workdir / "delta-table")) if sink in DELTA_KINDS
            else SinkSpec(sink, db_url=default_url(workdir), table=table))
    job = StreamJob(query=f"replay-{sink}", topic=topic, bootstrap=bootstrap,
                    checkpoint=str(workdir / "checkpoint"), sink=spec,
                    max_offsets_per_trigger=math.ceil(records / BATCHES), lookup=lookup,
                    transform_code=transform_code)

    def between(event: dict) -> None:
        if event.get("event") == "crashed":  # the query is down: risk ops edit the table
            set_threshold(lookup, V2)
        if on_event is not None:
            on_event(event)

    run = run_until_done(job, CRASH_AT, CRASH_HIT, log_dir=workdir, on_event=between, spare=spare,
                         resume="database" if sink == "transactional" else "checkpoint")
    history = None
    if sink in DELTA_KINDS:
        output, history = tables.read_table(spec.path)
    else:
        output = check.table_records(spec.db_url, spec.table)
    return ReplayExperiment(sink, audit(inputs, output), output, run, inputs, workdir, history)
