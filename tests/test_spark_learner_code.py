"""The sink, query and transform functions 08a-08d show are the code their crash experiments run.

Each test takes the cell that defines a notebook's foreachBatch function, changes one thing
in it, and runs the notebook's experiment with the changed function (from a module file, as
a learner's cell would be sent: its whole text, imports included). The audit must come out
as the change predicts, and differ from the audit the notebook shows for the cell as
shipped (nbval checks that one): so the experiment runs the code on screen, not the lab's
own sink.
"""
from __future__ import annotations

import pytest

from tests.notebook_cells import as_cell as load, compared_text, edited, read
from labkit import experiments
from labkit.pipelines.learner import LearnerCodeError
from labkit.spark import check
from labkit.spark.sinks import recorded_batches

pytestmark = pytest.mark.spark

CRASH_AT = "spark-after-sink-before-commit"


def sink_cell(notebook: str, function: str) -> str:
    (cell,) = [c.source for c in read(notebook).cells
               if c.cell_type == "code" and f"def {function}(" in c.source]
    return cell


def shown_audit(notebook: str, call: str) -> str:
    """The stored output of the notebook's cell that runs ``call`` (as nbval compares it)."""
    (cell,) = [c for c in read(notebook).cells if c.cell_type == "code" and call in c.source]
    return compared_text(cell)


def test_08a_a_naive_sink_that_drops_half_of_each_batch_loses_it(bootstrap, tmp_path):
    notebook = "08a_spark_checkpoints_and_sinks"
    assert "duplicated=20" in shown_audit(notebook, "print(naive.report.summary())")
    source = edited(sink_cell(notebook, "naive_sink"), "            db.executemany(INSERT.format(table=table), rows[half:])",
                    "            pass  # the second half is never written")
    exp = experiments.run("spark-naive", cluster=bootstrap, guarantee="at_least_once",
                          crash_at=CRASH_AT, records=60,
                          workdir=tmp_path / "run",
                          pipeline=load(source, "naive_sink"))
    r = exp.report
    # every batch of 20 keeps 10; the replayed batch 1 writes its first 10 again
    assert (r.produced, r.lost, r.duplicated) == (60, 30, 10), r.summary()


def test_08b_a_kafka_sink_that_writes_one_partition_loses_the_other(bootstrap, tmp_path):
    notebook = "08b_spark_kafka_in_and_out"
    assert "lost=0 duplicated=20" in shown_audit(notebook, 'kafka = experiments.run(')
    source = edited(sink_cell(notebook, "kafka_sink"), '(batch_df.select(',
                    '(batch_df.where("partition = 0").select(')
    exp = experiments.run("spark-kafka-sink", cluster=bootstrap,
                          guarantee="at_least_once", crash_at=CRASH_AT,
                          records=60, workdir=tmp_path / "run", keep_topics=False,
                          pipeline=load(source, "kafka_sink"))
    on_partition_1 = sum(1 for r in exp.inputs if r["id"] not in set(exp.output["id"]))
    assert exp.report.lost == on_partition_1 > 0, exp.report.summary()


def test_08c_a_delta_sink_without_txn_options_appends_the_replay(bootstrap, tmp_path):
    notebook = "08c_spark_delta_idempotent_writes"
    assert "lost=0 duplicated=0" in shown_audit(notebook, 'txn = experiments.run(')
    source = sink_cell(notebook, "delta_sink")
    for line in ('     .option("txnAppId", app_id)      # this query\'s id\n',
                 '     .option("txnVersion", batch_id)  # Spark\'s micro-batch id: the same on a replay\n'):
        source = edited(source, line, "")
    exp = experiments.run("spark-delta", cluster=bootstrap, guarantee="exactly_once",
                          crash_at=CRASH_AT, records=30,
                          workdir=tmp_path / "run",
                          pipeline=load(source, "delta_sink"), spare=False)
    # batch 1 (10 payments) committed before the crash, and again by the replay
    assert (exp.report.lost, exp.report.duplicated) == (0, 10), exp.report.summary()


def test_08a_exercise_2_as_shipped_gets_a_hint_and_a_changed_but_wrong_sink_is_crashed(bootstrap):
    """The shipped my_sink is naive_sink (section 1 measured its replay): the check says so
    without a run. A changed sink that still INSERTs runs under the crash into a table keyed
    by the payment id, and the check says why it failed, in words that do not change between
    runs (the solved one passes in nbval's run of 08a)."""
    from labkit.exercises.spark import NAIVE_SINK, check_my_sink, fingerprint

    notebook = "08a_spark_checkpoints_and_sinks"
    (cell,) = [c.source for c in read(notebook).cells
               if c.cell_type == "code" and c.source.startswith("# EXERCISE 2")]
    shipped = load(cell, "my_sink")
    # both cells are the function NAIVE_SINK fingerprints: the shortcut is about this code
    assert fingerprint(shipped) == fingerprint(load(sink_cell(notebook, "naive_sink"),
                                                    "naive_sink")) == NAIVE_SINK
    assert "still naive_sink" in check_my_sink(shipped, bootstrap).message
    changed = load(edited(cell, "half = len(rows) // 2", "half = len(rows) // 3"), "my_sink")
    verdict = check_my_sink(changed, bootstrap)
    assert not verdict.passed and "refused the replay" in verdict.message, verdict.message
    assert "Not yet" in str(check_my_sink(None, bootstrap))


def test_08a_the_query_on_screen_sets_what_a_replay_rewrites(bootstrap, tmp_path):
    """08a's query is a cell too: with up to 30 records per micro-batch instead of 20, the
    batch replayed after the crash (batch 1) is larger than the 20 the notebook shows, and the
    naive sink duplicates exactly its rows. (Spark splits the 30 over the two partitions by
    their backlog and rounds, so the batch need not be exactly 30: 29 here.)"""
    notebook = "08a_spark_checkpoints_and_sinks"
    assert "duplicated=20" in shown_audit(notebook, "print(naive.report.summary())")
    query = edited(sink_cell(notebook, "payments_query"), '.option("maxOffsetsPerTrigger", 20)',
                   '.option("maxOffsetsPerTrigger", 30)')
    exp = experiments.run("spark-naive", cluster=bootstrap, guarantee="at_least_once",
                          crash_at=CRASH_AT, records=60, workdir=tmp_path / "run",
                          pipeline=load(sink_cell(notebook, "naive_sink"), "naive_sink"),
                          query=load(query, "payments_query"))
    r = exp.report
    (replayed,) = exp.run.timeline.query("replay")["rows"]
    assert (r.produced, r.lost, r.duplicated) == (60, 0, replayed), r.summary()
    assert 20 < replayed <= 30


def test_a_query_that_is_never_started_is_refused_with_what_to_change(bootstrap, tmp_path):
    notebook = "08a_spark_checkpoints_and_sinks"
    query = edited(sink_cell(notebook, "payments_query"), ".start())", ")")
    with pytest.raises(Exception, match=r"not a started query: end it with \.start\(\)"):
        experiments.run("spark-naive", cluster=bootstrap, guarantee="at_least_once",
                        crash_at=None, records=60, workdir=tmp_path / "run",
                        query=load(query, "payments_query"), spare=False)


def test_a_query_asking_for_what_the_lab_does_not_pass_is_refused_before_spark_runs(bootstrap):
    def payments_query(spark, bootstrap_servers, sink):
        return None

    with pytest.raises(ValueError, match=r"asks for \['bootstrap_servers'\].*provides: checkpoint"):
        experiments.run("spark-naive", cluster=bootstrap, guarantee="at_least_once",
                        crash_at=None, records=60, query=payments_query)


def test_a_query_that_drops_a_column_the_audit_reads_is_refused_with_the_columns(bootstrap,
                                                                                   tmp_path):
    notebook = "08a_spark_checkpoints_and_sinks"
    query = edited(sink_cell(notebook, "payments_query"), '"topic", "partition", "offset"))',
                   '"topic", "partition"))')
    with pytest.raises(Exception, match=r"the query's rows lack \['offset'\]"):
        experiments.run("spark-naive", cluster=bootstrap, guarantee="at_least_once",
                        crash_at=None, records=60, workdir=tmp_path / "run",
                        query=load(query, "payments_query"), spare=False)


def test_08b_the_query_on_screen_decides_the_isolation(bootstrap, tmp_path):
    """08b's read_committed fix is a line of the learner's query: without it the same
    scenario, whose lab query would read committed, shows the aborted payments."""
    notebook = "08b_spark_kafka_in_and_out"
    assert "aborted_visible=0" in shown_audit(notebook, "print(exact.report.summary())")
    exp = experiments.run("spark-txn-input", cluster=bootstrap, guarantee="exactly_once",
                          crash_at=None, records=60, workdir=tmp_path / "run", spare=False,
                          query=load(sink_cell(notebook, "ledger_query"), "ledger_query"))
    assert exp.report.aborted_visible == 20 and exp.job.source_options == {}, exp.report.summary()
    with pytest.raises(ValueError, match="set them there"):
        experiments.run("spark-txn-input", cluster=bootstrap, guarantee="exactly_once",
                        records=60, query=load(sink_cell(notebook, "ledger_query"), "ledger_query"),
                        source_options={"kafka.isolation.level": "read_committed"})


@pytest.mark.parametrize("guarded", [True, False], ids=["as-shipped", "without-its-check"])
def test_08b_the_batch_id_sink_on_screen_writes_a_replay_once_and_without_its_check_twice(
        bootstrap, tmp_path, guarded):
    """08b's ledger_sink, the driver killed between its write of batch 1 and Spark's
    commits/1: Spark hands batch 1 to it again, with the same id and rows. Counted from the
    database: every committed payment once, each batch id recorded once. The same cell
    without its check on the batch id writes the replay again (its table has no unique key:
    only that check stops it)."""
    notebook = "08b_spark_kafka_in_and_out"
    assert "lost=0 duplicated=0" in shown_audit(notebook, "print(exact.report.summary())")
    source = sink_cell(notebook, "ledger_sink")
    if not guarded:
        source = edited(source, "            if last is not None and batch_id <= last:\n"
                        "                return  # a replay of a batch already written: nothing "
                        "to do\n", "")
    exp = experiments.run("spark-txn-input", cluster=bootstrap, guarantee="exactly_once",
                          crash_at=CRASH_AT, records=60, workdir=tmp_path / "run",
                          keep_topics=False, pipeline=load(source, "ledger_sink"),
                          spare=guarded)  # the unguarded run is the last crash here
    replays = exp.run.timeline.query("replay")
    assert exp.run.crashed and list(replays["batch_id"]) == [1], exp.run.timeline
    rows = check.table_records(exp.job.sink.db_url, exp.job.sink.table)
    batches = recorded_batches(exp.job.sink)
    assert set(rows["id"]) == {r["id"] for r in exp.inputs}  # nothing lost, nothing aborted
    if guarded:
        assert rows["id"].is_unique and batches == sorted(set(batches)), batches
        assert exp.report.exactly_once, exp.report.summary()
    else:  # batch 1's rows and its id a second time
        again = int(replays["rows"].iloc[0])
        assert len(rows) - rows["id"].nunique() == exp.report.duplicated == again > 0
        assert batches.count(1) == 2 and len(batches) == len(set(batches)) + 1, batches


def test_a_sink_asking_for_what_a_foreach_batch_function_is_not_given_is_refused(bootstrap):
    """Spark's offset ranges are in its checkpoint, not given to a foreachBatch function:
    a sink that names them is refused before Spark starts, with what the lab passes."""
    def ledger_sink(batch_df, batch_id, ranges):
        return None

    with pytest.raises(LearnerCodeError, match=r"asks for \['ranges'\].*provides: app_id"):
        experiments.run("spark-txn-input", cluster=bootstrap, guarantee="exactly_once",
                        records=60, pipeline=ledger_sink)


def test_08d_the_transform_on_screen_decides_what_the_replay_writes(bootstrap, tmp_path):
    """08d's upsert mixes two attempts because `review` looks the threshold up when the batch
    is processed; the same cell with the threshold fixed in its code (the same answer on
    every attempt) leaves one processing."""
    notebook = "08d_spark_replay_that_computes_something_else"
    assert "matches NO single processing" in shown_audit(notebook, "print(upsert.summary())")
    source = edited(sink_cell(notebook, "review"),
                    "version, cents = current_threshold(threshold_table)",
                    'version, cents = "v1", 50_000')
    exp = experiments.run("spark-replay", cluster=bootstrap, sink="idempotent", records=30,
                          workdir=tmp_path / "run", spare=False, pipeline=load(source, "review"))
    assert exp.mixed.valid and len(exp.output) == 30, exp.summary()


def test_a_transform_asking_for_what_the_lab_does_not_pass_is_refused_before_spark_runs(bootstrap):
    def review(rows, lookup_url):
        return rows

    with pytest.raises(LearnerCodeError, match="threshold_table"):
        experiments.run("spark-replay", cluster=bootstrap, sink="idempotent", pipeline=review)
