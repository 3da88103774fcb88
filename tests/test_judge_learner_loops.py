"""The capstone's verdict on loops a learner could write from the Kafka and librdkafka
documentation (tests/learner_loops.py), each kept to the three required crash points:

- an at-least-once loop (idempotent producer, flush, then the consumer's commit) is crashed
  where its guarantee is decided, as its offsets' commit is sent: charged twice;
- a transactional loop that sends each batch partition's last offset + 1 passes: its
  committed offsets stop before each partition's marker, and a restart reads nothing again;
- a loop that takes a fresh transactional.id at every start: a killed instance's
  transaction is named hanging (its successor waited for it), and nothing is called lost.
"""
from __future__ import annotations

from labkit import experiments
from labkit.exercises import capstone
from tests import learner_loops as loops


def test_an_at_least_once_loop_is_crashed_as_it_commits_whatever_its_points(bootstrap):
    assert capstone.crash_points_in(loops.at_least_once) == list(capstone.REQUIRED_POINTS)
    results = capstone.run_capstone(loops.at_least_once, "read_committed", bootstrap)
    committing = results.set_index("experiment").loc[capstone.label(capstone.COMMITTING)]
    assert committing["charged_twice"] > 0 and committing["lost"] == 0, results
    verdict = capstone.check_capstone(loops.at_least_once, "read_committed", results)
    assert not verdict.passed and "charged twice" in verdict.message, verdict
    assert "commit together" in verdict.message, verdict


def test_a_loop_sending_last_plus_one_per_batch_partition_passes(bootstrap, monkeypatch):
    """Judged as the notebook judges it: the table on the lab's address, then the verdict
    given the table alone, which takes up production's runs started with the points (a
    verdict that started them again took the points' time longer)."""
    results = capstone.run_capstone(loops.last_plus_one, "read_committed", bootstrap)
    started_again = []
    monkeypatch.setattr(capstone, "apart", lambda *a, **o: started_again.append(o))
    verdict = capstone.check_capstone(loops.last_plus_one, "read_committed", results)
    assert verdict.passed, verdict
    assert started_again == []


def test_a_fresh_transactional_id_per_start_hangs_a_transaction_and_loses_nothing(bootstrap):
    run = experiments.run("judge", pipeline=loops.fresh_transactional_id, cluster=bootstrap,
                          phase="point", fault="kill:endtxn:1", partitions=6)
    assert any("SIGKILLed as it sent EndTxn" in f for f in run.faults_fired), run.summary()
    # the killed instance's transaction held its offsets; its successor waited, then went on
    assert run.report.lost == 0 and run.report.duplicated == 0, run.summary()
    assert list(run.findings) == ["hanging-transaction"], run.summary()
    assert any("left open by a dead instance" in w for w in run.waited), run.summary()
