"""What CI compares in the notebooks: each key claim's cell keeps a stored output that nbval
compares (no NBVAL_IGNORE_OUTPUT / skip, the claim's text in stdout or text/plain), and no
raw librdkafka log line (``%4|...|GETPID|...``) is stored anywhere.

A claim is (a string that finds its one code cell by source, text its stored output shows).
Moving a claim into an ignored cell, a picture or stderr makes this test fail.
"""
from __future__ import annotations

import re

import pytest

from tests.notebook_cells import NAMES, all_output_text, compared_text, is_compared, read

KEY_CLAIMS: dict[str, list[tuple[str, str]]] = {
    "00_tour": [
        ("last acknowledged offset + 1", "on every partition written: True"),
        ("view.offsets_frame()", "high_watermark"),
        ("print(LAB.caption())", "3. runner (supervisor) -> worker processes: start, kill, restart"),
    ],
    "01_at_most_once": [
        ("print(crash.report.summary())", "lost=10 duplicated=0"),
        ("committed offset of the group", "committed offset of the group: [{0: 40}]"),
        ("the lost payments are the last ones sent", "in one piece: True"),
        ("retried.report.summary()", "lost=0 duplicated=0"),
        ("print(diff(fire_and_forget", '+        "acks": "all"'),
        ("any(m.skips for m in defaults.seen)", "a moment when a crash books payments twice: True"),
        ("any(m.skips for m in defaults.seen)", "a moment when a crash never books payments: True"),
        ("store_after_work(lab.bootstrap", "a moment when a crash books payments twice: True"),
        ("store_after_work(lab.bootstrap", "a moment when a crash never books payments: False"),
        ("check_loses_nothing(lab.bootstrap, my_loop, commit_first)", "🔁 Not yet"),
    ],
    "02_at_least_once": [
        ("print(crash.report.summary())", "lost=0 duplicated=10"),
        ("twice.groupby", "r-000011    [10, 20]"),
        ("lost_ack.report.summary()", "duplicated=5"),
        ("print(count.report.summary())", "duplicated=10 reordered=0 aborted_visible=0  state: DRIFTED"),
        ("check_books_once(lab.bootstrap, my_ledger_loop)", "🔁 Not yet"),
    ],
    "03_idempotent_producer": [
        ("confluent-kafka with default settings", "producer id: -1"),
        ('"records in the log"', "records in the log"),
        ("pipeline=produce_payments_idempotently", "lost=0 duplicated=0"),
        ("print(diff(produce_payments", '+        "enable.idempotence": True'),
        ("producer ids in the log", "base sequences: [0, 5, 10, 15, 20, 25, 30, 35]"),
        ("def send_payments", "idempotent=False: produced=20 delivered_unique=20 lost=0 duplicated=0 reordered=2"),
        ("def send_payments", "idempotent=True: produced=20 delivered_unique=20 lost=0 duplicated=0 reordered=0"),
        ("def send_payments", "answered: NOT_LEADER_OR_FOLLOWER, OUT_OF_ORDER_SEQUENCE_NUMBER"),
        ("print(crash.report.summary())", "duplicated=10"),
        ("def send_batch", "10 acknowledged at offsets 10-19"),
        ("def send_batch", "lost=0 duplicated=10"),
        ("check_keeps_order(lab.bootstrap, my_send_payments, send_payments)", "🔁 Not yet"),
        ("check_idempotent_crash(lab.bootstrap, my_producer_ids", "🔁 Not yet"),
    ],
    "03b_when_the_broker_fails": [
        ("print(acks_1.summary())", "acknowledged=40 in_log=20 lost_acknowledged=20"),
        ("print(acks_all.summary())", "acknowledged=40 in_log=40 lost_acknowledged=0 duplicated=0"),
        ("print(unclean.summary())", "lost_acknowledged=20"),
        ("print(unclean.summary())", "election: unclean (an out-of-sync replica)"),
    ],
    "03c_when_the_network_takes_sides": [
        ("acks_1.acknowledged_by)", "acknowledged during the split, by broker: {'1': 20}"),
        ('print("broker 1 says broker 1 leads:"', "the controller's leader epoch is higher: True"),
        ('print("broker 1 says broker 1 leads:"', "records broker 1's log has beyond the new leader's: 20"),
        ("acks_1.lost_acknowledged_by)", "acknowledged=40 in_log=20 lost_acknowledged=20"),
        ("acks_1.lost_acknowledged_by)", "lost_acknowledged == records written during the split: True"),
        ("acks_all.acknowledged_by.get(", "records broker 1 acknowledged during the split: 0"),
        ("acks_all.acknowledged_by.get(", "lost_acknowledged=0"),
        ("check_split_loss(lab, my_lost)", "🔁 Not yet"),
    ],
    "05b_when_the_coordinator_fails": [
        ("print(run.report.summary())", "produced=60 delivered_unique=60 lost=0 duplicated=0 reordered=0 aborted_visible=0"),
        ("print(run.report.summary())", "a new coordinator after each kill: True"),
    ],
    "04_transactions": [
        ('batches["kind"] = batches["marker"]', "ABORT"),
        ("with its default isolation level", "reads: ['t1-debit', 't3-debit']"),
        ('for isolation in ("read_committed", "read_uncommitted")', "aborted_visible=2"),
        ("a transaction is open since offset", "partition 0: a transaction is open since offset 6"),
        ("read_for(committed_reader, 1.5)", "read_committed   got: ['t1-debit', 't3-debit']"),
        ("the hanging app wakes up", "_FENCED"),
        ("tail.assign(", "ABORT  hanging app               1"),
        ("print(TRANSACTION.caption())", "5. transaction coordinator -> partition leaders: WriteTxnMarkers"),
        ("check_book_transfers(lab.bootstrap, book_transfers)", "🔁 Not yet"),
        ("check_transactions(lab.bootstrap, my_high_watermark", "🔁 Not yet"),
    ],
    "05_consume_transform_produce": [
        ("print(one.report.summary())", "markers in the output log: COMMIT ABORT COMMIT COMMIT COMMIT"),
        ("print(one.report.summary())", "(aborted copy + committed copy): 10"),
        ("committed offset of the group", "[{0: 40}]"),
        ("print(before.summary())", "lost=10"),
        ("print(after.summary())", "duplicated=10"),
        ("off_by_one.summary()", "['r-000010']"),
        ("ledger_report.summary()", "duplicated=10"),
        ("r = shortcut.report", "exactly once: False; lost: 0; charged twice: True"),
        ("print(diff(fee_service, general_fee_service, cell=True)", "+                consumer.position(consumer.assignment()),"),
        ("r = general.report", "exactly once: True; lost: 0; charged twice: False"),
    ],
    "05c_kafka_into_a_database": [
        ('approach="commit-first"', "lost=10 duplicated=0"),
        ('approach="commit-first"', "the group's committed offsets: {0: 25, 1: 26, 2: 29}"),
        ('approach="insert-first"', "lost=0 duplicated=10"),
        ('approach="offsets-in-database"', "the offsets table: {0: 25, 1: 26, 2: 29}   "
                                            "committed to Kafka: {}"),
        ('approach="offsets-in-database"', "after-commit, in-transaction-before-commit       "
                                            "True    80     0           0"),
        ('approach="idempotent"', "lost=0 duplicated=0 reordered=0 aborted_visible=0  state: "
                                  "DRIFTED"),
        ('approach="idempotent"', "payments: 80, counted in accounts: 95"),
    ],
    "05d_the_outbox": [
        ('order="table-first"', "lost=10 duplicated=0"),
        ('order="table-first"', "the payments table: 40 rows, 40 payments"),
        ('order="kafka-first"', "lost=0 duplicated=10"),
        ("connector_config(exactly_once=True)", "exactly.once.support = required"),
        ("at-least-once: lost", "at-least-once: lost 0, duplicated: some; exactly the events "
                                "the killed worker had sent after its stored offsets: True"),
        ("at-least-once: lost", "exactly-once: lost 0, duplicated 0, every event once: True; "
                                "the killed worker's sends, in the log as aborted records: True"),
        ("alos.stored_at_kill", "the slot confirmed up to the stored commit LSN: True"),
        ("alos.stored_at_kill", "Debezium resumed after the stored LSN: True"),
        ("eos.open_before_kill", "open at the kill: [(True, 'Ongoing')]"),
    ],
    "06_zombies": [
        ("records the zombie added to the log", "zombie commit -> _FENCED (fatal: True"),
        ("fencing = exchanges(wire)", "instance-B: InitProducerId v4  -> CONCURRENT_TRANSACTIONS"),
        ("fencing = exchanges(wire)", "instance-A: Produce v10  -> INVALID_PRODUCER_EPOCH"),
        ('for isolation in ("read_committed", "read_uncommitted")', "verdict: exactly once"),
        ("takeover_lines(group_run)", "given partitions again: True"),
        ("takeover_lines(group_run)", "verdict: exactly once"),
        ("pipeline=group_id_only", "zombie told: nothing: its commit went through"),
        ("pipeline=group_id_only", "lost=0 duplicated=10"),
        ("check_fenced_zombie(fenced_metadata", "🔁 Not yet"),
        ("slow_member = experiments.run(\"poll-interval-zombie\"", "zombie told: UNKNOWN_MEMBER_ID (abortable)"),
        ("slow_member = experiments.run(\"poll-interval-zombie\"", "lost=0 duplicated=0"),
        ("slow = experiments.run(\"txn-timeout\"", "commit_transaction raised: _FENCED (fatal)"),
        ("slow = experiments.run(\"txn-timeout\"", "producers used: 2; records of aborted transactions in the log: 10"),
        ("slow = experiments.run(\"txn-timeout\"", "lost=0 duplicated=0"),
        ("errors_by_class(", "_FENCED      fatal"),
        ("errors_by_class(", "UNKNOWN_MEMBER_ID  abortable"),
    ],
    "09b_on_the_wire": [
        ("print(\" -> \".join(f\"{r['api']}", "AddOffsetsToTxn v0 -> TxnOffsetCommit v3 -> EndTxn v1"),
        ("print(\" -> \".join(f\"{r['api']}", "every request that carries one: [0]"),
        ("def epochs_in_words", "librdkafka  epoch per transaction: flat at 0"),
        ("def epochs_in_words", "Java copier epoch per transaction: rising, 0 -> 1 -> 2 -> 3"),
        ("def epochs_in_words", "Java copier sent: InitProducerId v5, Produce v13, TxnOffsetCommit v6, "
                                "EndTxn v5; never: ['AddPartitionsToTxn', 'AddOffsetsToTxn']"),
        ("for name, run in runs.items()", "classic   dead member's partitions idle"),
        ("for name, run in runs.items()", "a survivor left with no partitions: False; exactly once: True"),
    ],
    "09c_the_late_write": [
        ("this kernel's clients", "librdkafka 2.16.0"),
        ('classic = experiments.run("late-write"', "client: librdkafka 2.16.0 (classic transaction protocol)"),
        ('classic = experiments.run("late-write"', "the broker answered it: ACCEPTED"),
        ('classic = experiments.run("late-write"', "read_committed sees: ['t1', 't2']"),
        ('classic = experiments.run("late-write"', "NOT exactly once (aborted-read)"),
        ('tv2 = experiments.run("late-write"', "client: kafka-clients 4.4.0 (transaction version 2)"),
        ('tv2 = experiments.run("late-write"', "the broker answered it: PRODUCER_FENCED"),
        ('record = experiments.run("late-write"', "the broker answered it: INVALID_PRODUCER_EPOCH"),
        ("check_late_produce(my_answer, my_visible)", "🔁 Not yet"),
        ("side = pd.DataFrame", "aborted-read"),
    ],
    "09d_the_java_loop": [
        ("the Java loop's client", "kafka-clients-4.4.0"),
        ("parent = java_loop.parents(", "ApplicationRecoverableException"),
        ("parent = java_loop.parents(", "max.block.ms = 30000 ms"),
        ('point = experiments.run("judge"', "lost=0 duplicated=0"),
        ('point = experiments.run("judge"', "fired: ['after-send-offsets-before-commit', 'mid-batch']"),
        ('fenced = experiments.run("judge"', "lost=0 duplicated=0"),
        ('fenced = experiments.run("judge"', "raised an ApplicationRecoverableException, fatal: True"),
        ('fenced = experiments.run("judge"', "findings beside the audit: none"),
        ("check_without_transaction(my_verdict, my_lost)", "🔁 Not yet"),
    ],
    "07_stateful_exactly_once": [
        ('alo = run_count("at_least_once")', "duplicated=10 reordered=0 aborted_visible=0  state: DRIFTED"),
        ('eo = run_count("exactly_once")', "lost=0 duplicated=0 reordered=0 aborted_visible=0  state: matches"),
        ("markers in the changelog", "markers in the changelog: COMMIT ABORT COMMIT COMMIT COMMIT"),
        ("markers in the changelog", "changelog records read"),
        ("pipeline=careless_count", "duplicated=0 reordered=0 aborted_visible=0  state: DRIFTED"),
        ("def over_counted", "DRIFTED"),
        ("def streams_count", "at_least_once over-counted: yes"),
        ("def streams_count", "exactly_once_v2 over-count: 0"),
        ("eo_streams.aborted_in_log", "records of aborted transactions in the log: yes | seen by the audit: 0"),
        ("check_store_on_disk(count_on_disk", "🔁 Not yet"),
    ],
    "07b_what_a_crash_costs_kafka_streams": [
        ("TRANSACTIONAL_STATE_STORES_CONFIG", "props.put(StreamsConfig.TRANSACTIONAL_STATE_STORES_CONFIG, true);"),
        ("def crash_and_restart", "enable.transactional.statestores=false: exactly once: True, lost=0 "
                                  "duplicated=0, counts match the input: True"),
        ("def crash_and_restart", "enable.transactional.statestores=true: exactly once: True, lost=0 "
                                  "duplicated=0, counts match the input: True"),
        ("0 < on.restored_records", "false: restored == committed at the kill: True"),
        ("0 < on.restored_records", "true:  0 < restored < committed at the kill: True"),
        ("check_short_keys(lab.bootstrap, my_restore)", "🔁 Not yet"),
    ],
    "08a_spark_checkpoints_and_sinks": [
        ("checkpoint_view(first.checkpoint)", "MISSING"),
        ("batch 1 replayed with the offsets", "planned before the crash: True"),
        ("naive.run.timeline[", "sink done, crashed before commit"),
        ("print(naive.report.summary())", "duplicated=20"),
        ("rows too many in all", "rows too many in all: 20"),
        ('rows.append({"sink"', "transactional (rows + offsets)"),
    ],
    "08b_spark_kafka_in_and_out": [
        ("print(kafka.report.summary())", "duplicated=20"),
        ("print(retry.report.summary())", "lost=0 duplicated=5"),
        ("input partitions of the duplicated ids", "input partitions of the duplicated ids: [0]"),
        ("after a dedupe by id", "lost=0 duplicated=0 exactly once: True"),
        ("print(trap.report.summary())", "aborted_visible=20"),
        ("print(exact.report.summary())", "lost=0 duplicated=0 reordered=0 aborted_visible=0"),
        ("calls of ledger_sink per batch id", "calls of ledger_sink per batch id: {0: 1, 1: 2,"),
        ("calls of ledger_sink per batch id", "batch ids in spark_batches:        [0, 1, 2, 3, 4]"),
        ("planned = ckpt.batches(exact.job.checkpoint)", "start_offset  end_offset  offsets  rows"),
        ('groups or "none"', "input topic: none"),
    ],
    "08c_spark_delta_idempotent_writes": [
        ('txn = experiments.run("spark-delta"', "lost=0 duplicated=0"),
        ('txn = experiments.run("spark-delta"', "lost=0 duplicated=10"),
        ("def history_of", "txnVersion: the sink ran 4 times, the table has 3 commits"),
        ("def history_of", "plain append: the sink ran 4 times, the table has 4 commits"),
        ("def history_of", "txnVersion 1"),
    ],
    "08d_spark_replay_that_computes_something_else": [
        ("upsert = experiments.run(\"spark-replay\"", "idempotent: 26 rows, 3 mixed keys -> matches NO single processing"),
        ("upsert = experiments.run(\"spark-replay\"", "delta: 26 rows, 0 mixed keys -> matches ONE processing"),
        ("kafka_eo = experiments.run(\"kafka-replay\"", "10 aborted in the log, 0 mixed keys -> ONE processing"),
    ],
    "08e_spark_real_time_mode": [
        ("the trigger as Spark applied it: {rt.trigger}", "RealTimeTrigger(5000)"),
        ("the trigger as Spark applied it: {rt.trigger}", "lost: 0; payments written twice: some"),
        ("micro_batch_query = edited", "ProcessingTimeTrigger(0); lost: 0"),
        ("after a dedupe by id", "RealTimeTrigger(5000), after a dedupe by id: exactly once (lost=0 duplicated=0)"),
        ("after a dedupe by id", "ProcessingTimeTrigger(0), after a dedupe by id: exactly once (lost=0 duplicated=0)"),
    ],
    "08f_flink_two_phase_commit": [
        ("killed during checkpoint N, restored N-1", "exactly_once: lost 0, written twice: none; "
                                                     "killed during checkpoint N, restored N-1: True"),
        ("killed during checkpoint N, restored N-1", "at_least_once: lost 0, written twice: some; "
                                                     "killed during checkpoint N, restored N-1: True"),
        ("report.marker_epochs(exactly", "the job frozen before the kill: Ongoing"),
        ("report.marker_epochs(exactly", "its records aborted: True"),
        ("report.marker_epochs(exactly", "one epoch above its records' (transaction version 2): True"),
        ("the payment was produced (median)", "after the payment was produced (median): True"),
        ("the payment was produced (median)", "and later than in the log (median): True"),
        ("trap.flink_said[0]", "after 6 s down and the restore: CompleteAbort, True"),
        ("trap.flink_said[0]", "lost: True; exactly that transaction's records: True; "
                               "written twice: 0"),
        ("trap.flink_said[0]", "In both cases this most likely signals data loss"),
        ("check_flink_job(my_job", "🔁 Not yet"),
    ],
    "09_cost": [
        ('summary["all_delivered"]', "every run delivered every record exactly once: True"),
        ('grid_table["all_delivered"]', "every run delivered every record exactly once: True"),
        ("longest median wait for a read_committed reader",
         "longest median wait for a read_committed reader: transactional"),
        ("findings.commit_wait_falls_with_interval(grid_table)", "at every record size: yes"),
        ("cost_units.one_of_each_per_commit(wire)",
         "every commit: exactly one EndTxn and one accepted AddPartitionsToTxn: yes"),
    ],
    "10_capstone": [
        ("for points in capstone.experiments(ledger_service)", "crash at after-commit"),
        ("capstone.found(results)", "crash at after-produce-before-flush and after-process-before-commit"),
        ("capstone.found(results)", "lost produce ack, refused record"),
        ("capstone.found(results)", "crash as its commit is sent"),
        ("capstone.check_capstone(ledger_service, accounting_reads, results)", "🔁 Not yet"),
        ("capstone.check_capstone(ledger_service, accounting_reads, results)", "commit together, atomically"),
    ],
    "11_share_groups": [
        ("killed, frozen = ", "killed: exit codes [-9, 0]"),
        ("killed, frozen = ", "lost=0 duplicated=1 reordered=0 aborted_visible=0\n  verdict: NOT exactly once (duplicate): it behaved as at least once\n  archived=0 delivery counts (highest per record -> records): {1: 1, 2: 39}"),
        ("killed, frozen = ", "archived=0 delivery counts (highest per record -> records): {1: 1, 2: 9}"),
        ("if a.id == twice", "r-000002: processed, delivery count 2"),
        ("if a.id == twice", "worked on by two processes: True"),
        ("left to deliver", "left to deliver (available or never delivered): 0"),
        ("if a.id == again", "r-000002: refused: INVALID_RECORD_STATE, delivery count 1"),
        ("if a.id == again", "worked on by one process: True"),
        ("implicit.summary()", "duplicated=40"),
        ("poison.summary()", "r-000003: delivery 5: released"),
        ('guarantee="exactly_once", records=40', "KIP-1289"),
        ("check_work_once(take_orders_once", "🔁 Not yet"),
    ],
    "12_your_own_pipeline": [
        ("buggy = harness.torture(", "lost > 0: True"),
        ("buggy = harness.torture(", "verdict: at most once"),
        ("story = timeline.torture_story(events)", "starts: 4, kills: 3"),
        ("story = timeline.torture_story(events)", "committed offsets reached the input's end: True"),
        ("story = timeline.torture_story(events)", "output records fewer than input records: True"),
        ("own_pipeline.check_own_pipeline(my_fixed_app, app_dir)", "there are duplicates"),
        ("hung = harness.torture(", "kills: 0, restarts: 1"),
        ("hung = harness.torture(", "stalled: 1"),
        ("hung = harness.torture(", "verdict: exactly once"),
        ("hung = harness.torture(", "aborted records in the output's log > 0: True"),
    ],
}
RAW_LIBRDKAFKA_LINE = re.compile(r"^%\d\|", re.M)


def test_every_notebook_has_key_claims():
    assert sorted(KEY_CLAIMS) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_key_claims_stay_compared(name):
    cells = [c for c in read(name).cells if c.cell_type == "code"]
    for marker, shown in KEY_CLAIMS[name]:
        found = [c for c in cells if marker in c.source]
        assert len(found) == 1, f"{name}: {len(found)} code cells contain {marker!r}, expected 1"
        cell = found[0]
        assert is_compared(cell), f"{name}: the cell with {marker!r} is not compared by nbval"
        assert shown in compared_text(cell), (
            f"{name}: the cell with {marker!r} no longer shows {shown!r} in a compared output")


@pytest.mark.parametrize("name", NAMES)
def test_no_raw_librdkafka_log_line_is_stored(name):
    for i, cell in enumerate(read(name).cells):
        if cell.cell_type == "code":
            lines = RAW_LIBRDKAFKA_LINE.findall(all_output_text(cell))
            assert not lines, f"{name} cell {i} stores librdkafka log lines: route the client's " \
                              "logs through labkit.kafka.clientlog.client_config"
