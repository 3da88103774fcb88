"""labkit.cost.bench, run tiny against the real broker: the shape and sanity of what it measures;
and the tables and the conclusion derived from them, on numbers made up to test them.

No timing thresholds (the machine is shared and noisy): only facts that hold at any speed.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest
from confluent_kafka import KafkaError

from labkit.cost import bench, findings, published
from labkit.cost.lane import GUARANTEES, Lane, measure, producer_config
from labkit.kafka.clientlog import COORDINATOR_STALL_WORKAROUND_MS
from labkit.kafka.inspect import Inspector


def test_measure_delivers_every_record_once_and_counts_transactions(bootstrap):
    m = measure(bootstrap, "transactional", records=23, value_bytes=64, records_per_txn=5)
    assert (m.delivered, m.duplicates, m.records) == (23, 0, 23)
    assert m.transactions == 5  # 5+5+5+5+3
    assert m.records_per_s > 0 and 0 < m.flush_seconds < m.commit_seconds <= m.seconds
    # an unpaced run reads after producing: no latency is claimed for it
    assert math.isnan(m.latency_p50_ms) and math.isnan(m.latency_p99_ms)


def test_paced_run_takes_at_least_records_over_rate(bootstrap):
    m = measure(bootstrap, "at_least_once", records=20, value_bytes=64, rate=100)
    assert m.rate == 100 and m.delivered == 20 and m.commit_seconds == 0
    assert m.seconds >= 19 / 100  # the 20th record waits for its turn at 100 records/s
    assert 0 <= m.latency_p50_ms <= m.latency_p99_ms


def test_a_lane_runs_many_times_on_one_topic_and_counts_each_run_apart(bootstrap):
    topic = "bench-lane-test"
    with Lane(bootstrap, "transactional", value_bytes=64, topic=topic) as lane:
        first = lane.run(30, records_per_txn=10)
        second = lane.run(12, records_per_txn=5)
    assert (first.delivered, first.transactions, second.delivered, second.transactions) == (30, 3, 12, 3)
    assert first.duplicates == second.duplicates == 0
    with Inspector(bootstrap) as inspector:
        # warm-up record + its COMMIT marker, then each run's records + one marker per txn
        assert inspector.offsets(topic)[0].high_watermark == (1 + 1) + (30 + 3) + (12 + 3)


def test_compare_guarantees_and_summary_shape(bootstrap):
    runs = bench.compare_guarantees(bootstrap, records=30, value_bytes=128, repeats=2,
                                    latency_rate=500, latency_records=10, latency_repeats=1)
    assert len(runs) == 3 * len(GUARANTEES)
    assert runs.groupby("mode").size().to_dict() == {"throughput": 8, "latency": 4}
    # the rounds take turns in alternating order: ABCD, then DCBA
    fast = runs[runs["mode"] == "throughput"]
    assert list(fast["guarantee"]) == list(GUARANTEES) + list(GUARANTEES)[::-1]
    assert (runs["delivered"] == runs["records"]).all() and (runs["duplicates"] == 0).all()
    # at 30 records and a 100 ms commit interval the transactional run commits at least once
    assert (runs.loc[runs.guarantee == "transactional", "transactions"] >= 1).all()
    assert (runs.loc[runs.guarantee != "transactional", "transactions"] == 0).all()
    summary = findings.summarize(runs)
    assert list(summary.index) == list(GUARANTEES)
    assert summary["all_delivered"].all()
    assert summary.loc["at_least_once", "throughput_vs_baseline_pct"] == 0.0
    assert (summary["records_per_s"] > 0).all() and summary["latency_p50_ms"].notna().all()
    assert summary.loc["transactional", "ms_per_commit"] > 0
    assert findings.conclude(summary).fastest in GUARANTEES


def test_commit_grid_pairs_each_interval_with_at_least_once_of_its_size(bootstrap):
    grid = bench.commit_grid(bootstrap, value_sizes=(64, 256), intervals_ms=(5, 50),
                             records={64: 40, 256: 20}, repeats=2)
    assert len(grid) == 2 * 3 * 2 and (grid["delivered"] == grid["records"]).all()
    table = findings.summarize_grid(grid)
    assert list(table.index) == [(64, "at_least_once"), (64, "transactional@5ms"),
                                 (64, "transactional@50ms"), (256, "at_least_once"),
                                 (256, "transactional@5ms"), (256, "transactional@50ms")]
    assert (table.xs("at_least_once", level="config")["throughput_vs_baseline_pct"] == 0).all()
    assert table["all_delivered"].all()


def test_commit_sweep_rows_per_size(bootstrap):
    runs = bench.commit_sweep(bootstrap, sizes=(1, 4), records={1: 3, 4: 8}, value_bytes=64,
                              repeats=1, latency_rate=200, latency_records=4)
    fast = runs[runs["mode"] == "throughput"].set_index("records_per_txn")
    assert fast.loc[1, "transactions"] == 3 and fast.loc[4, "transactions"] == 2
    summary = findings.summarize(runs, by="records_per_txn", baseline=None)
    assert list(summary.index) == [1, 4] and summary["all_delivered"].all()


@pytest.mark.parametrize("kwargs, message", [
    ({"guarantee": "exactly_twice"}, "unknown guarantee"),
    ({"guarantee": "idempotent", "records_per_txn": 10}, "only apply to 'transactional'"),
    ({"guarantee": "transactional", "records_per_txn": 0}, "records_per_txn must be"),
    ({"guarantee": "at_least_once", "value_bytes": 4}, "value_bytes"),
    ({"guarantee": "at_least_once", "rate": 0}, "rate must be"),
])
def test_bad_input_says_what_to_do(kwargs, message):
    with pytest.raises(ValueError, match=message):
        measure("127.0.0.1:1", **{"records": 10, **kwargs})


def test_bench_measures_the_settings_the_guarantee_classes_define():
    from labkit.pipelines.guarantee import guarantee

    classes = {"at_most_once": guarantee("at_most_once"),
               "at_least_once": guarantee("at_least_once"),
               "idempotent": guarantee("at_least_once", idempotent=True),
               "transactional": guarantee("exactly_once")}
    assert set(classes) == set(GUARANTEES)
    for name, g in classes.items():
        conf = producer_config("127.0.0.1:1", name)
        settings = g.producer_settings(conf.get("transactional.id"))
        assert {k: conf[k] for k in settings} == settings, name
        # plus, for a transactional producer, the lab's workaround for a librdkafka stall
        workaround = {"connections.max.idle.ms"} if "transactional.id" in settings else set()
        assert set(conf) - set(settings) <= {"bootstrap.servers", "linger.ms", "logger",
                                             *workaround}, name
        assert conf.get("connections.max.idle.ms") == (
            COORDINATOR_STALL_WORKAROUND_MS if workaround else None), name


# ---- the derived conclusion, on made-up runs (no broker) ----

def fake_runs(speeds: dict[str, list[float]], latencies: dict[str, list[float]] | None = None,
              value_bytes: int = 1024, commit_share: float = 0.1) -> pd.DataFrame:
    """Rows shaped like compare_guarantees'/commit_grid's: ``speeds[name][round]`` records/s."""
    rows = []
    for name, per_round in speeds.items():
        txn = name.startswith("transactional")
        for repeat, rps in enumerate(per_round):
            seconds = 10_000 / rps
            rows.append({"mode": "throughput", "repeat": repeat, "guarantee": name.split("@")[0],
                         "config": name, "records": 10_000, "value_bytes": value_bytes,
                         "records_per_s": rps, "mb_per_s": rps * value_bytes / 1e6,
                         "seconds": seconds, "transactions": 5 if txn else 0,
                         "commit_seconds": seconds * commit_share if txn else 0.0,
                         "flush_seconds": seconds * commit_share * 0.75 if txn else 0.0,
                         "latency_p50_ms": math.nan, "latency_p99_ms": math.nan,
                         "delivered": 10_000, "duplicates": 0})
    for name, per_round in (latencies or {}).items():
        for repeat, p50 in enumerate(per_round):
            rows.append({"mode": "latency", "repeat": repeat, "guarantee": name, "config": name,
                         "records": 300, "value_bytes": value_bytes, "records_per_s": 1000.0,
                         "mb_per_s": 1.0, "seconds": 0.3, "transactions": 0,
                         "commit_seconds": 0.0, "flush_seconds": 0.0, "latency_p50_ms": p50,
                         "latency_p99_ms": 2 * p50, "delivered": 300, "duplicates": 0})
    return pd.DataFrame(rows)


NOISE = [1.0, 3.0, 0.5, 2.0, 1.5]  # what the rest of the machine does to each round


def test_pairing_within_a_round_cancels_the_machines_noise():
    runs = fake_runs({"at_least_once": [100_000 * m for m in NOISE],
                      "transactional": [80_000 * m for m in NOISE]})
    summary = findings.summarize(runs)
    # unpaired, the ranges overlap widely; paired, every round says -20 %
    assert summary.loc["transactional", "records_per_s_max"] > summary.loc["at_least_once", "records_per_s_min"]
    row = summary.loc["transactional"]
    assert (row.throughput_vs_baseline_pct, row.vs_baseline_pct_q1, row.vs_baseline_pct_q3) == (-20.0, -20.0, -20.0)
    assert findings.conclude(summary).verdict("transactional") == "slower"


def test_the_conclusion_follows_the_numbers_not_a_fixed_sentence():
    latencies = {"at_most_once": [30, 31, 29], "at_least_once": [33, 35, 34],
                 "transactional": [90, 80, 110]}
    # transactional 20 % slower in every round; at_most_once faster in some rounds, slower in others
    clear = fake_runs({"at_most_once": [100_000 * m * f for m, f in zip(NOISE, [1.3, 0.8, 1.2, 0.9, 1.1])],
                       "at_least_once": [100_000 * m for m in NOISE],
                       "transactional": [80_000 * m for m in NOISE]}, latencies)
    c = findings.conclude(findings.summarize(clear))
    assert c.fastest == "at_most_once" and c.runner_up == "at_least_once" and not c.fastest_clear
    assert c.verdict("transactional") == "slower"
    assert c.verdict("at_most_once") == "no difference beyond the spread"
    assert (c.slowest_to_read, c.slowest_to_read_clear) == ("transactional", True)
    assert c.headline() == ("In this run, exactly-once (transactional) had 20 % less "
                            "throughput than at_least_once (the middle half of the rounds: 20 "
                            "to 20 % less), and a read_committed reader waited longest for its records "
                            "(median 90 ms: a record is readable once its transaction commits).")
    lines = c.lines()
    assert lines[0].startswith("fastest: at_most_once") and lines[0].endswith("beyond the spread: no")
    assert "transactional vs at_least_once: -20.0 % throughput (middle half of the rounds -20.0 to -20.0 %): slower" in lines
    assert lines[-1].endswith("in every round: yes")

    # the same guarantees, other numbers: the statements change with them
    flipped = fake_runs({"at_most_once": [150_000 * m for m in NOISE],
                         "at_least_once": [100_000 * m for m in NOISE],
                         "transactional": [100_000 * m * f for m, f in zip(NOISE, [1.1, 0.9, 1.05, 0.95, 1.0])]},
                        {**latencies, "at_most_once": [30, 95, 29]})
    c = findings.conclude(findings.summarize(flipped))
    assert (c.fastest, c.fastest_clear) == ("at_most_once", True)
    assert c.verdict("at_most_once") == "faster"
    assert c.verdict("transactional") == "no difference beyond the spread"
    assert (c.slowest_to_read, c.slowest_to_read_clear) == ("transactional", False)
    assert c.lines()[-1].endswith("in every round: no")
    assert c.headline().startswith("In this run, exactly-once (transactional) showed no "
                                   "throughput difference from at_least_once beyond the spread")


def test_conclude_needs_a_baseline_table():
    runs = fake_runs({"at_least_once": [1.0, 2.0], "transactional": [1.0, 2.0]})
    with pytest.raises(ValueError, match="with a baseline"):
        findings.conclude(findings.summarize(runs, baseline=None))
    with pytest.raises(ValueError, match="needs the baseline 'at_most_once'"):
        findings.conclude(findings.summarize(runs), baseline="at_most_once")


def fake_grid(cost_at_100ms: float, share_10ms: float = 0.6, share_100ms: float = 0.1) -> pd.DataFrame:
    parts = []
    for size in (100, 1024):
        base = [100_000 * m for m in NOISE]
        parts.append(fake_runs({"at_least_once": base}, value_bytes=size))
        parts.append(fake_runs({"transactional@10ms": [b * 0.5 for b in base]}, value_bytes=size,
                               commit_share=share_10ms))
        parts.append(fake_runs({"transactional@100ms": [b * (1 + cost_at_100ms / 100) for b in base]},
                               value_bytes=size, commit_share=share_100ms))
    return pd.concat(parts, ignore_index=True)


def test_published_figures_beside_the_grid_and_why_they_differ():
    amo = findings.summarize(fake_runs({"at_most_once": [100_000 * m for m in NOISE],
                                        "at_least_once": [100_000 * m for m in NOISE],
                                        "transactional": [85_000 * m for m in NOISE]}),
                             baseline="at_most_once")
    summary = findings.summarize(fake_runs({"at_most_once": [100_000 * m for m in NOISE],
                                            "at_least_once": [100_000 * m for m in NOISE],
                                            "transactional": [85_000 * m for m in NOISE]}))
    near = findings.summarize_grid(fake_grid(cost_at_100ms=-3))
    beside = published.beside_published(near, amo).set_index("published")
    assert beside.loc["-3 %", "comparison"] == "within the spread"
    assert beside.loc["-3 %", "measured here"] == "transactional@100ms, 1024 B records"
    assert beside.loc["-20 %", "comparison"] == "published cost larger than measured"  # -15 here
    assert beside.loc["-30 to -15 %", "comparison"] == "published cost larger than measured"

    far = findings.summarize_grid(fake_grid(cost_at_100ms=-40))
    beside = published.beside_published(far, amo).set_index("published")
    assert beside.loc["-3 %", "comparison"] == "published cost smaller than measured"
    why = published.explain(far, summary, amo)
    assert len(why) == 3
    # 10 % of the run in commits of a run with 5 commits; 3 % at 100 ms leaves ~3 ms per commit
    assert "leaves about 3 ms per commit" in why[0] and "10 % of the run" in why[0]
    # 10 % of 0.1 s (10,000 records at 100,000/s) over 5 commits: 2 ms, 1.5 ms of it flushing
    assert "held the producer 2 ms" in why[0] and "2 ms of it waiting" in why[0]
    assert "leaves about 18-43 ms per commit" in why[2]
    assert "at_most_once (acks=0) vs at_least_once: +0.0 %, no difference beyond the spread" in why[1]


def test_commit_wait_share_against_interval():
    assert findings.commit_wait_falls_with_interval(findings.summarize_grid(fake_grid(-3)))
    assert not findings.commit_wait_falls_with_interval(
        findings.summarize_grid(fake_grid(-3, share_10ms=0.1, share_100ms=0.2)))


def test_the_pictures_render_from_the_tables():
    from labkit.widgets import cost

    runs = fake_runs({"at_least_once": [100_000 * m for m in NOISE],
                      "transactional": [80_000 * m for m in NOISE]},
                     {"at_least_once": [30, 31, 32], "transactional": [80, 90, 100]})
    runs["rate"] = 1000.0
    for picture in (cost.guarantees_picture(runs),
                    cost.grid_picture(findings.summarize_grid(fake_grid(-3)))):
        assert picture.png.startswith(b"\x89PNG") and len(picture.png) > 10_000
        assert repr(picture).endswith("(static picture)>")


def test_a_reader_stops_at_a_consumer_error_and_the_next_run_says_so(bootstrap):
    # A real broker error under the reader: the records at its fetch position are deleted
    # while it is paused, so on resuming it fetches before the log start (offset out of
    # range). Before, the reader skipped every error and looped on, reading nothing, until
    # the lane closed; a run then waited out its drain timeout and reported fewer records.
    from confluent_kafka import KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    from labkit.kafka.clientlog import client_config

    with Lane(bootstrap, "at_least_once", value_bytes=64, warmup=False) as lane:
        reader, partition = lane.reader, [TopicPartition(lane.topic, 0)]
        reader.reading.clear()  # it holds off (as in a throughput run), so its client is free
        reader.consumer.pause(partition)  # nothing fetched while records come and go
        producer = Producer(client_config({"bootstrap.servers": bootstrap}))
        for _ in range(5):
            producer.produce(lane.topic, value=b"x" * 64, partition=0)
        assert producer.flush(30) == 0
        admin = AdminClient(client_config({"bootstrap.servers": bootstrap}))
        for future in admin.delete_records([TopicPartition(lane.topic, 0, 5)]).values():
            assert future.result(30).low_watermark == 5
        reader.consumer.resume(partition)
        reader.reading.set()
        reader.join(60)
        assert not reader.is_alive()  # the thread ended by itself, the lane still open
        assert isinstance(reader.error, KafkaException)
        assert reader.error.args[0].code() == KafkaError._AUTO_OFFSET_RESET
        with pytest.raises(KafkaException):  # at once, not after the drain timeout
            lane.run(3)


def _notebook_loop(changes: dict[str, str] | None = None):
    """09's transactional_loop as its cell defines it, with ``changes`` made to the text."""
    from tests.notebook_cells import as_cell, read

    (source,) = [c.source for c in read("09_cost").cells
                 if c.cell_type == "code" and "def transactional_loop(" in c.source]
    for old, new in (changes or {}).items():
        assert old in source, f"09's loop no longer contains {old!r}"
        source = source.replace(old, new)
    return as_cell(source, "transactional_loop")


def test_09_the_loop_on_screen_is_what_the_transactional_lane_runs(bootstrap):
    """The same rounds with 09's loop as shipped and with its produce line doubled: the
    read_committed reader gets every record once, then copies of them (it stops counting
    once every record has arrived, so not necessarily all), in both modes."""
    doubled = _notebook_loop({"        producer.produce(topic, value=value)\n":
                              "        producer.produce(topic, value=value)\n" * 2})
    for loop, doubles in ((_notebook_loop(), False), (doubled, True)):
        runs = bench.compare_guarantees(bootstrap, guarantees=("transactional",), records=500,
                                        repeats=1, latency_records=100, latency_repeats=1,
                                        transactional_loop=loop)
        assert list(runs["mode"]) == ["throughput", "latency"]
        for run in runs.itertuples():
            assert run.delivered == run.records and (run.duplicates > 0) == doubles, run


def test_a_loop_asking_for_what_the_lane_does_not_pass_is_refused_before_any_topic(bootstrap):
    def transactional_loop(producer, topic, records):
        pass

    with pytest.raises(ValueError, match="values"):
        bench.compare_guarantees(bootstrap, guarantees=("transactional",),
                                 transactional_loop=transactional_loop)
