"""labkit.bench, run tiny against the real broker: the shape and sanity of what it measures.

No timing thresholds (the machine is shared and noisy): only facts that hold at any speed.
"""
from __future__ import annotations

import pytest

from labkit import bench


def test_measure_delivers_every_record_once_and_counts_transactions(bootstrap):
    m = bench.measure(bootstrap, "transactional", records=23, value_bytes=64, records_per_txn=5)
    assert (m.delivered, m.duplicates, m.records) == (23, 0, 23)
    assert m.transactions == 5  # 5+5+5+5+3
    assert m.records_per_s > 0 and m.seconds > 0
    assert 0 <= m.latency_p50_ms <= m.latency_p99_ms


def test_paced_run_takes_at_least_records_over_rate(bootstrap):
    m = bench.measure(bootstrap, "at_least_once", records=20, value_bytes=64, rate=100)
    assert m.rate == 100 and m.delivered == 20
    assert m.seconds >= 19 / 100  # the 20th record waits for its turn at 100 records/s


def test_compare_guarantees_and_summary_shape(bootstrap):
    runs = bench.compare_guarantees(bootstrap, records=30, value_bytes=128, repeats=1,
                                    latency_rate=500, latency_records=10)
    assert len(runs) == 2 * len(bench.GUARANTEES)
    assert set(runs["mode"]) == {"throughput", "latency"}
    assert (runs["delivered"] == runs["records"]).all() and (runs["duplicates"] == 0).all()
    # at 30 records and a 100 ms commit interval the transactional run commits at least once
    assert (runs.loc[runs.guarantee == "transactional", "transactions"] >= 1).all()
    assert (runs.loc[runs.guarantee != "transactional", "transactions"] == 0).all()
    summary = bench.summarize(runs)
    assert list(summary.index) == list(bench.GUARANTEES)
    assert summary["all_delivered"].all()
    assert summary.loc["at_least_once", "throughput_vs_baseline_pct"] == 0.0
    assert (summary["records_per_s"] > 0).all()


def test_commit_sweep_rows_per_size(bootstrap):
    runs = bench.commit_sweep(bootstrap, sizes=(1, 4), records={1: 3, 4: 8}, value_bytes=64,
                              repeats=1, latency_rate=200, latency_records=4)
    fast = runs[runs["mode"] == "throughput"].set_index("records_per_txn")
    assert fast.loc[1, "transactions"] == 3 and fast.loc[4, "transactions"] == 2
    summary = bench.summarize(runs, by="records_per_txn", baseline=None)
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
        bench.measure("127.0.0.1:1", **{"records": 10, **kwargs})


def test_bench_measures_the_settings_the_guarantee_classes_define():
    from labkit.pipelines.guarantee import guarantee

    classes = {"at_most_once": guarantee("at_most_once"),
               "at_least_once": guarantee("at_least_once"),
               "idempotent": guarantee("at_least_once", idempotent=True),
               "transactional": guarantee("exactly_once")}
    assert set(classes) == set(bench.GUARANTEES)
    for name, g in classes.items():
        conf = bench.producer_config("127.0.0.1:1", name)
        settings = g.producer_settings(conf.get("transactional.id"))
        assert {k: conf[k] for k in settings} == settings, name
        assert set(conf) - set(settings) <= {"bootstrap.servers", "linger.ms", "logger"}, name
