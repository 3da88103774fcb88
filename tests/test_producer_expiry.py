"""Idempotence's memory, on a real broker of the run's own: one idempotent batch is written,
its answer lost, its retry held back 4 s. A broker that forgets a producer after 2 s writes
the retry again (the whole batch duplicated, acknowledged at the second copy's offsets); with
Kafka's default (one day) the retry is recognised and the batch is in the log once."""
from __future__ import annotations

from labkit import experiments
from labkit.experiments import producer_expiry
from tests.test_failover import refused_before_any_broker, scenario_on_a_lab_of_its_own

RECORDS = 10


def test_a_retry_after_the_broker_forgot_the_producer_is_written_twice(tmp_path):
    run = scenario_on_a_lab_of_its_own(tmp_path, 300, "producer-expiry", "--expiration-ms",
                                       "2000", "--records", str(RECORDS))
    assert (run["produced"], run["delivered_unique"], run["lost"], run["duplicated"]) == \
        (RECORDS, RECORDS, 0, RECORDS), run
    # the producer was told of the second copy only; nobody was told of the first
    assert run["acknowledged"] == RECORDS and run["acknowledged_at"] == [RECORDS, 2 * RECORDS - 1], run
    assert run["produce_requests"] == 2 and run["produce_errors"] == [], run["produce_trace"]


def test_while_the_broker_remembers_the_producer_the_retry_is_written_once():
    run = experiments.run("producer-expiry", expiration_ms=producer_expiry.KAFKA_DEFAULT_MS,
                          records=RECORDS, announce=lambda line: None)
    r = run.report
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated) == (RECORDS, RECORDS, 0, 0), r.summary()
    # the retry was answered with the offsets of the first (and only) copy
    assert (run.acknowledged, run.acknowledged_at) == (RECORDS, (0, RECORDS - 1)), run.to_json()
    assert run.produce_requests == 2, run.produce_trace


def test_the_cli_refuses_what_it_cannot_run_before_any_broker_starts(tmp_path):
    refused_before_any_broker(tmp_path, "producer-expiry", [
        (["--expiration-ms", "0"], "expiration_ms must be 1 or more"),
        (["--records", "5000"], "records must be 1 to 1000"),
        (["--guarantee", "exactly_once"], "No such option"),
    ])
    refused_before_any_broker(tmp_path, "reorder", [
        (["--idempotent", "--expiration-ms", "5"], "No such option: --expiration-ms"),
    ])
