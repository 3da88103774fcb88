"""Every scenario x guarantee x applicable crash point (and a lost produce ack), audited.

The expected numbers are the theory, for a crash on the 2nd batch of 10 records:
at-most-once loses what it committed before doing, at-least-once repeats what it did
before committing, exactly-once does neither. Each cell runs once here; the soak that
runs the exactly-once cells again and again, with its recorded results, is
benchmarks/matrix_soak.py.
"""
from __future__ import annotations

import pytest

from labkit import experiments
from labkit.experiments import scenarios
from labkit.faults.crashpoints import CRASH_EXIT_CODE

RECORDS = 50
BATCH = scenarios.batch_size(RECORDS)
LOST_ACK = "drop-ack:produce:1"  # the 1st produce request (the first half of batch 1)

# at_most_once: records lost when the crash hits here (committed, not done).
LOST = {"after-poll-before-process": 0, "after-commit-before-process": BATCH,
        "mid-batch": BATCH // 2, "after-produce-before-flush": BATCH - BATCH // 2,
        "after-state-update-before-commit": BATCH}
# at_least_once: records done twice when the crash hits here (done, not committed).
DUPLICATED = {"after-poll-before-process": 0, "mid-batch": BATCH // 2,
              "after-produce-before-flush": BATCH // 2, "after-process-before-commit": BATCH,
              "after-state-update-before-commit": 0, "after-commit": 0}
# exactly_once: records of the transaction the crash left open that reached the log before
# the SIGKILL; the restarted producer's init_transactions() aborts them. The first half of a
# batch is flushed before "mid-batch"; at "after-produce-before-flush" the second half is
# still in the client's buffer and dies with it; from "in-transaction-before-commit" on, the
# whole batch was flushed. (running-count's "after-state-update-before-commit" comes before
# any produce: nothing to abort.) Without transactions nothing is ever aborted.
ABORTED_IN_LOG = {"mid-batch": BATCH // 2, "after-produce-before-flush": BATCH // 2,
                  "in-transaction-before-commit": BATCH,
                  "after-send-offsets-before-commit": BATCH}
# What the one verdict calls a run that found losses or duplicates, per guarantee.
PROMISED = {"at_most_once": "at most once", "at_least_once": "at least once",
            "exactly_once": "exactly once"}
# running-count: where the final counts are wrong (the store counted a batch twice, or
# the offsets skipped a batch before it was counted).
STATE_DRIFTS = {("at_most_once", "after-commit-before-process"),
                ("at_least_once", "after-state-update-before-commit"),
                ("at_least_once", "mid-batch"), ("at_least_once", "after-produce-before-flush"),
                ("at_least_once", "after-process-before-commit")}


def crash_cells():
    for name in scenarios.SCENARIOS:
        for guarantee in scenarios.GUARANTEES:
            for point in (None, *scenarios.crash_points(name, guarantee)):
                yield pytest.param(name, guarantee, point, id=f"{name}-{guarantee}-{point}")


def fault_cells():
    for name, s in scenarios.SCENARIOS.items():
        if not s.produces:
            continue
        for guarantee in scenarios.GUARANTEES:
            yield pytest.param(name, guarantee, id=f"{name}-{guarantee}-lost-ack")


@pytest.mark.parametrize("name,guarantee,crash_at", list(crash_cells()))
def test_crash_matrix(bootstrap, name, guarantee, crash_at):
    run = experiments.run(name, guarantee=guarantee, crash_at=crash_at,
                          records=RECORDS, cluster=bootstrap)
    report = run.report
    if crash_at:
        assert run.run.crashed and run.run.exit_codes == [CRASH_EXIT_CODE, 0]
    assert report.produced == RECORDS and report.reordered == 0
    if scenarios.SCENARIOS[name].produces:
        # measured: the log read uncommitted vs committed; the audit's reader saw none of it
        aborted = ABORTED_IN_LOG.get(crash_at, 0) if guarantee == "exactly_once" else 0
        assert (report.aborted_in_log, report.aborted_visible) == (aborted, 0), report.to_dict()
    else:
        assert report.aborted_in_log is None  # a table sink: no log to look at
    if guarantee == "at_most_once":
        assert (report.lost, report.duplicated) == (LOST.get(crash_at, 0), 0), report.summary()
    elif guarantee == "at_least_once":
        assert (report.lost, report.duplicated) == (0, DUPLICATED.get(crash_at, 0)), report.summary()
    else:
        assert (report.lost, report.duplicated) == (0, 0), report.summary()
        assert report.exactly_once
    if scenarios.SCENARIOS[name].stateful:
        assert report.state_expected is not None
        drift = (guarantee, crash_at) in STATE_DRIFTS
        assert report.state_matches is not drift, (report.state_expected, report.state_actual)
    assert report.delivered_unique == RECORDS - report.lost
    found = report.lost or report.duplicated
    assert report.verdict == (PROMISED[guarantee] if found else
                              "exactly once" if report.state_matches else "incorrect")


@pytest.mark.parametrize("name,guarantee", list(fault_cells()))
def test_lost_ack_matrix(bootstrap, name, guarantee):
    run = experiments.run(name, guarantee=guarantee, fault=LOST_ACK, records=RECORDS,
                          cluster=bootstrap)
    report = run.report
    assert run.fault_stats["requests"]["Produce"] >= 1
    assert (report.aborted_in_log, report.aborted_visible) == (0, 0), report.to_dict()
    assert report.duplicated == 0 or guarantee == "at_least_once"
    if guarantee == "at_most_once":
        # acks=0: there is no ack to lose; the proxy cuts the connection instead, and how
        # many records were still in flight on it is a race. Never a duplicate, though.
        assert report.duplicated == 0
        return
    assert run.fault_stats["responses_dropped"] == 1
    assert report.lost == 0 and report.state_matches, report.summary()
    if guarantee == "at_least_once":
        # The batch landed, its ack did not: the retry writes it again.
        assert report.duplicated == BATCH // 2, report.summary()
    else:
        # Same lost ack, but the idempotent (transactional) producer's retry is deduplicated.
        assert report.exactly_once, report.summary()


def test_fire_and_forget_writes_are_in_the_log_when_a_finished_run_is_audited(bootstrap):
    # acks=0: flush() returns once the requests are written to the socket; here each
    # produce request is held back 1.5 s on its way (a busy broker). A worker that finished
    # normally must not be audited before the broker handled them (CI once read 0 of 50).
    run = experiments.run("producer", guarantee="at_most_once", records=RECORDS,
                          cluster=bootstrap, fault="delay:1500:produce")
    assert run.fault_stats["requests"]["Produce"] >= 1
    assert (run.report.lost, run.report.duplicated) == (0, 0), run.report.summary()
