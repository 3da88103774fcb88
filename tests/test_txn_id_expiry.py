"""Fencing after an idle transactional.id expired, on a real broker of the run's own: A
commits, idles past transactional.id.expiration.ms (2 s here), B starts with the same id and
commits, A wakes up and commits too, handling each error by its class. The coordinator gave
B a new producer id (2 in the output), yet the zombie wrote nothing: first refused
INVALID_PRODUCER_ID_MAPPING (abortable), then fenced when it asked for a new epoch. With
Kafka's default (7 days) B took A's producer id over with a new epoch, and A was fenced at
once."""
from __future__ import annotations

from labkit import experiments
from labkit.experiments import txn_id_expiry
from tests.test_failover import refused_before_any_broker, scenario_on_a_lab_of_its_own

RECORDS = 10


def test_a_zombie_whose_id_expired_is_still_refused_first_abortably(tmp_path):
    run = scenario_on_a_lab_of_its_own(tmp_path, 300, "txn-id-expiry", "--expiration-ms",
                                       "2000", "--records", str(RECORDS))
    assert run["producer_ids"] == 2, run  # the id had expired: B got a producer id of its own
    assert run["zombie_errors"] == ["INVALID_PRODUCER_ID_MAPPING (abortable)", "_FENCED (fatal)"], run
    assert (run["zombie_committed"], run["delivered_unique"], run["lost"], run["duplicated"]) == \
        (False, RECORDS, 0, 0), run


def test_while_the_id_is_remembered_the_zombie_is_fenced_at_once():
    run = experiments.run("txn-id-expiry", expiration_ms=txn_id_expiry.KAFKA_DEFAULT_MS,
                          records=RECORDS, announce=lambda line: None)
    assert run.producer_ids == 1 and run.zombie_errors == ["_FENCED (fatal)"], run.to_json()
    r = run.report
    assert (run.zombie_committed, r.delivered_unique, r.lost, r.duplicated) == \
        (False, RECORDS, 0, 0), r.summary()


def test_the_cli_refuses_what_it_cannot_run_before_any_broker_starts(tmp_path):
    refused_before_any_broker(tmp_path, "txn-id-expiry", [
        (["--records", "7"], "records must be even"),
        (["--expiration-ms", "-1"], "expiration_ms must be 1 or more"),
        (["--fault", "drop-ack:produce:1"], "No such option"),
    ])
