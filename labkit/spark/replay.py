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

``labkit.experiments.spark`` composes it: the query (``labkit.spark.clients.SparkQuery`` with
``stream_job``), the crash (``CrashAt``) and the threshold change (``ThresholdChange``, on the
event ``crashed``) as its nemesis, ``ReplayAudit`` as its checker.
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from labkit.checking import checkers, reads
from labkit.checking.audit import mixed_report
from labkit.checking.checks import Counted
from labkit.checking.checkers import Result
from labkit.faults.nemesis import Fault, Run as Broken, Trigger
from labkit.pipelines import learner
from labkit.pipelines.lookup import V1, V2, VERSION_FIELD, processing, set_threshold
from labkit.spark import check
from labkit.spark.child import TRANSFORM_PROVIDES
from labkit.spark.columns import RECORD_COLUMNS, SEQUENCE_COLUMN
from labkit.spark.runner import StreamJob
from labkit.spark.sinks import DELTA_KINDS, SinkSpec
from labkit.storage.db import default_url

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


def versions_by_position(output: pd.DataFrame) -> pd.DataFrame:
    """Per input partition and threshold version: how many rows, and the input offsets
    they span (what the table shows: the offsets are columns the sink writes). One
    processing with one change gives, per partition, V1 offsets all below V2 offsets;
    overlapping spans are two attempts mixed."""
    tags = [v for _, v in observed(output)]
    frame = output.assign(threshold_version=tags)
    return (frame.groupby(["kafka_partition", "threshold_version"])["kafka_offset"]
            .agg(rows="size", first_offset="min", last_offset="max").reset_index())


def check_transform(transform: Any, o: Any = None) -> None:
    """The learner's transform names only what the worker passes, before Spark starts."""
    learner.check_parameters(transform, TRANSFORM_PROVIDES)
    learner.code_of(transform)


def stream_job(o: Any, run: Any, workdir: Path) -> StreamJob:
    """The threshold pipeline into sink ``o.sink`` over the run's input: three micro-batches,
    the lookup table in ``workdir``, the learner's transform (``run.pipeline``: it may name
    ``rows``, the batch's rows as dicts, and ``threshold_table``, the lookup's SQLite file,
    and returns the rows to write) or the lab's ``lookup.apply_threshold``."""
    table = f"{o.sink.replace('-', '_')}_{run.run_id}"
    spec = (SinkSpec(o.sink, table=table, path=str(workdir / "delta-table"))
            if o.sink in DELTA_KINDS else SinkSpec(o.sink, db_url=default_url(workdir), table=table))
    transform = run.pipeline
    return StreamJob(query=f"replay-{o.sink}", topic=run.topics["input"], bootstrap=run.bootstrap,
                     checkpoint=str(workdir / "checkpoint"), sink=spec,
                     max_offsets_per_trigger=math.ceil(o.records / BATCHES),
                     lookup=str((workdir / "lookup.db").resolve()),
                     transform_code=None if transform is None else {
                         "code": learner.code_of(transform), "function": transform.__name__})


class ThresholdChange(Fault):
    """The review threshold is ``V1`` from the start (set up in the query's lookup table)
    and risk operations lower it to ``V2`` when ``trigger`` fires: the query is down."""

    name = "the review threshold lowered while the query is down"

    def __init__(self, trigger: Trigger):
        self.trigger = trigger

    def setup(self, run: Broken) -> None:
        set_threshold(run.facts["job"].lookup, V1)

    def invoke(self, run: Broken) -> None:
        set_threshold(run.facts["job"].lookup, V2)
        run.fired(self, f"risk operations lower the review threshold from {V1[0]} to "
                        f"{V2[0]} while the query is down")


class ReplayAudit:
    """The sink's rows (a table, or a Delta table read back by Spark) audited for mixed
    attempts: a mixed key is a drifted key of the computed state. Facts: ``output``,
    ``mixed`` (the Result), and a Delta table's ``table_history`` (a live run's).

    Its read is kept in the run's history (a ``table-read`` of the sink, or Spark's read
    of the Delta table as a ``kept`` entry) and a stored run is re-checked from it; where
    the sink is (the run's ``job`` fact: a table's name holds the run's id) is asked on a
    live run only."""

    # every read goes through labkit.checking.reads: a stored run re-checks it
    replayable: ClassVar[bool] = True

    def __init__(self, sink: str):
        self.sink = sink

    def __call__(self, run: Any) -> Counted:
        if self.sink in DELTA_KINDS:
            output = pd.DataFrame(reads.kept(run, "delta-table", lambda: check.delta_rows(run)))
        else:
            output = pd.DataFrame(reads.table(run, "sink", RECORD_COLUMNS, lambda: (
                run.facts["job"].sink.db_url, run.facts["job"].sink.table),
                order_by=SEQUENCE_COLUMN))
        mixed = audit(run.inputs, output)
        guarantee = "at_least_once" if self.sink == "delta-append" else "exactly_once"
        report = mixed_report(f"spark-replay [{self.sink}]", guarantee, CRASH_AT,
                              len(run.inputs), [i for i, _ in observed(output)], mixed)
        return Counted(report, {"output": output, "mixed": mixed})


def facts(run: Any) -> dict:
    """What notebooks read besides the audit (``versions_by_position()`` as before)."""
    output = run.facts["output"]
    return {"sink": run.o.sink, "inputs": run.inputs, "mixed_keys": run.facts["mixed"].count,
            "versions_by_position": partial(versions_by_position, output)}


def summary(run: Any) -> str:
    """Stable text for notebooks: the sink, its row count and the mixed keys."""
    return (f"{run.sink}: {len(run.output)} rows, {run.mixed.count} mixed keys -> "
            f"{'matches ONE processing' if run.mixed.valid else 'matches NO single processing'}")
