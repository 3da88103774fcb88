"""Non-determinism on replay: a replayed batch computed with a lookup that changed.

The checker first (plain data), then the real experiment (labkit.spark.replay): a review
threshold lowered while the query is down after a SIGKILL between its sink and the commit
log. The upsert sink ends with two attempts' output mixed; the transactional sink and Delta's
txnVersion keep the first attempt's (the upsert and Delta in notebook 08d's compared output).
"""
from __future__ import annotations

import pytest

from labkit import experiments

from labkit.checking import checkers
from labkit.pipelines.learner import LearnerCodeError
from labkit.spark import replay
from tests.notebook_cells import as_cell, edited, read
from tests.test_stored_runs import checked_again, no_kafka  # noqa: F401 (a fixture)

INPUTS = [("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b"), ("a3", "a")]
FIRST = {"a1": 1, "b1": 1, "a2": 1, "b2": 1, "a3": 1}
SECOND = {"a1": 2, "a2": 2, "b2": 2}  # the second processing holds b1 and a3 back


def test_single_processing_checker():
    one = checkers.single_processing
    assert one(INPUTS, FIRST.items(), [FIRST, SECOND]).valid
    assert one(INPUTS, SECOND.items(), [FIRST, SECOND]).valid
    # the change between a2 and a3 (a) and before b1 (b): still one processing per record
    cut = [("a1", 1), ("a2", 1), ("b2", 2)]
    assert one(INPUTS, cut, [FIRST, SECOND]).valid
    # a3 kept from the first attempt after a2 came from the second: no single processing
    mixed = one(INPUTS, [("a1", 2), ("a2", 2), ("a3", 1), ("b2", 2)], [FIRST, SECOND])
    assert (mixed.name, mixed.count, mixed.examples) == ("mixed-attempts", 1, ["a"])
    # a record missing that both processings write is no processing of it either
    assert one(INPUTS, [("a1", 1), ("a3", 1), ("b1", 1), ("b2", 1)], [FIRST, SECOND]).examples == ["a"]
    # two copies of a record with different values: never one processing
    assert one(INPUTS, [*FIRST.items(), ("b2", 2)], [FIRST, SECOND]).examples == ["b"]


RECORDS = 30


@pytest.mark.spark
def test_the_transactional_sink_keeps_one_processing_under_a_changed_lookup(bootstrap, tmp_path,
                                                                          no_kafka):
    """The upsert (mixed) and Delta's txnVersion (one processing) run in notebook 08d, whose
    compared output shows each partition's v1 and v2 offset spans; the transactional sink,
    resumed from the database's offsets, runs here."""
    exp = experiments.run("spark-replay", cluster=bootstrap, sink="transactional",
                          records=RECORDS, workdir=tmp_path, spare=False)
    assert exp.run.attempts[0].crashed and not exp.run.attempts[-1].crashed
    v1, v2 = replay.V1[0], replay.V2[0]
    by = exp.versions_by_position()
    spans = {int(p): {t: (int(a), int(b)) for t, a, b in
                      g[["threshold_version", "first_offset", "last_offset"]].itertuples(index=False)}
             for p, g in by.groupby("kafka_partition")}
    # The replay wrote nothing: the first attempt's rows, then the second's, in every
    # partition; one processing, each payment once.
    assert exp.mixed.valid and exp.mixed.count == 0, exp.mixed
    assert all(s[v1][1] < s[v2][0] for s in spans.values()), spans
    assert exp.output["id"].is_unique
    # stored and checked again without Kafka or the database (issue 50): the sink's rows,
    # kept in the history, give the live verdict and the same mixed keys
    again = checked_again(exp, exp.store(tmp_path / "replay.jsonl"), no_kafka)
    assert again.facts["mixed"] == exp.mixed


def test_kafka_transactions_commit_one_attempt(bootstrap):
    """Consume-transform-produce, killed after producing its 2nd batch and before committing
    its offsets, the threshold lowered while it is down."""
    from labkit.experiments import nondeterminism

    eo = experiments.run("kafka-replay", cluster=bootstrap, guarantee="exactly_once")
    assert eo.report.verdict == "exactly once", eo.report.summary()  # the one audit agrees
    # The first attempt's batch is in the log but aborted; read_committed gets the replay's.
    assert eo.mixed.valid and eo.aborted_in_log == nondeterminism.BATCH
    assert {v for _, v in eo.committed} == {replay.V1[0], replay.V2[0]}
    assert len({i for i, _ in eo.committed}) == len(eo.committed)
    alo = experiments.run("kafka-replay", cluster=bootstrap, guarantee="at_least_once")
    assert alo.report.verdict == "at least once" and alo.report.state_actual, alo.report.summary()
    # Both attempts' output delivered: payments with two outcomes, keys mixed.
    assert alo.mixed.count > 0 and alo.aborted_in_log == 0
    assert len({i for i, _ in alo.committed}) < len(alo.committed)


def loop_cell() -> str:
    """08d's loop: the production loop with the threshold screening (test_one_loop holds it
    to that)."""
    (cell,) = [c.source for c in read("08d_spark_replay_that_computes_something_else").cells
               if c.cell_type == "code" and "def review_service(" in c.source]
    return cell


def test_08d_the_loop_on_screen_is_what_the_kafka_replay_runs(bootstrap):
    """08d's review_service with its lookup replaced by the first threshold, written in its
    code: the restart screens under v1 as well, so read_committed gets every payment once,
    all v1 (the notebook's loop, which looks it up, shows 22 with v2's), while the killed
    attempt's batch is still aborted in the log."""
    from labkit.experiments import nondeterminism

    fixed = edited(loop_cell(), "version, cents = current_threshold(threshold_table)",
                   'version, cents = "v1", 50_000')
    exp = experiments.run("kafka-replay", cluster=bootstrap, guarantee="exactly_once",
                          pipeline=as_cell(fixed, "review_service"))
    assert exp.run.exit_codes[0] == -9 and exp.run.exit_codes[-1] == 0, exp.run
    r = exp.report  # against the input: every payment, once
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated) == (RECORDS, RECORDS, 0, 0), \
        r.summary()
    assert len(exp.committed) == RECORDS and {v for _, v in exp.committed} == {replay.V1[0]}
    assert exp.mixed.valid and exp.aborted_in_log == nondeterminism.BATCH


def test_a_loop_the_replay_cannot_kill_or_feed_is_refused_before_it_runs():
    """Refused before any broker or worker starts (the cluster given is never reached)."""
    without_point = edited(loop_cell(), '            crash_point("after-send-offsets-before-commit")\n',
                           "")
    with pytest.raises(LearnerCodeError, match="never calls crash_point"):
        experiments.run("kafka-replay", cluster="localhost:1", guarantee="exactly_once",
                        pipeline=as_cell(without_point, "review_service"))
    asks_more = edited(loop_cell(), "threshold_table, group_protocol", "lookup_url, group_protocol")
    with pytest.raises(LearnerCodeError, match=r"asks for \['lookup_url'\].*threshold_table"):
        experiments.run("kafka-replay", cluster="localhost:1", guarantee="exactly_once",
                        pipeline=as_cell(asks_more, "review_service"))
