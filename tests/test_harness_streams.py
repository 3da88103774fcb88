"""Real Kafka Streams under `labkit torture`: the same running count
(examples/torture/StreamsRunningCount.java, kafka-streams 4.4.0), the same seeded kills,
one setting apart. at_least_once over-counts, exactly_once_v2 stays exact: the last count
per key in the output against a recount of the input (`--check counts`)."""
from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from labkit.checking import audit

from labkit.pipelines import data

from labkit.pipelines import contract
from labkit.torture import apps, harness
from labkit.checking.record import RunRecord
from tests.test_harness import no_process_left_behind  # noqa: F401 (autouse fixture)

RECORDS = 1200
COMMIT_INTERVAL_MS = 1500
# Each kill lands 0.5-1.0 s after the app's first offset commit since its (re)start, so
# between two of its commits (1.5 s apart) whatever its JVM start took: what it processed
# since that commit (~100-200 records at 5 ms each) has reached the output and the
# changelog, and its input offsets have not. 1,200 records outlast two such kills.
RUN = dict(records=RECORDS, kills=2, seed=1, check="counts", kill_after=(0.5, 1.0),
           kill_clock="commit", timeout=240)


def test_kafka_streams_at_least_once_over_counts_exactly_once_v2_stays_exact(cluster):
    def run(guarantee: str) -> RunRecord:
        command = apps.streams_command(guarantee, commit_interval_ms=COMMIT_INTERVAL_MS,
                                       work_ms=5)
        return harness.torture(command, cluster=cluster, **RUN)

    # Side by side (each run has its own topics and group): both mostly wait on JVM starts
    # and commits, so this costs little more than one run.
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(apps.STREAMS_GUARANTEES, pool.map(run, apps.STREAMS_GUARANTEES)))
    truth = audit.expected_counts(data.generate(RECORDS, seed=1))
    for guarantee, r in results.items():
        assert (r.kills, r.restarts) == (2, 2), (guarantee, r.notes)
        assert r.report.produced == RECORDS and r.report.state_expected == truth, r.summary()
        kinds = [json.loads(line)["kind"] for line in
                 (Path(r.run_dir) / "history.jsonl").read_text().splitlines()]
        assert kinds.count("killed") == 2 and kinds.count("started") == 3
        # The run's topics are gone afterwards, Kafka Streams' own changelog included.
        run = Path(r.run_dir).name
        assert not [t for t in AdminClient({"bootstrap.servers": cluster.bootstrap})
                    .list_topics(timeout=10).topics if t.startswith(f"torture-{run}")]

    alo = results["at_least_once"].report
    # Restarted from the last committed offsets, on a store restored from a changelog that
    # already holds the replayed records' counts: counted twice, never too few.
    assert alo.duplicated > 0 and alo.lost == 0, results["at_least_once"].summary()
    assert all(alo.state_actual[k] >= n for k, n in truth.items())
    assert alo.state_actual != truth
    assert results["at_least_once"].verdict == "at least once"

    eo = results["exactly_once_v2"].report
    assert (eo.duplicated, eo.lost) == (0, 0), results["exactly_once_v2"].summary()
    assert eo.state_actual == truth
    assert results["exactly_once_v2"].verdict == "exactly once"
    # The kills landed inside transactions: their output stays in the log, aborted, and
    # read_committed readers (the audit, the restore of the store) never see it.
    assert eo.aborted_in_log > 0


def test_bad_guarantee_and_kill_clock_are_named():
    with pytest.raises(contract.HarnessError, match="at_least_once, exactly_once_v2"):
        apps.streams_command("exactly_once")
    with pytest.raises(contract.HarnessError, match="kill_clock must be one of start, commit"):
        harness.torture([sys.executable, "-c", "pass"], kill_clock="output")
