"""`labkit torture` gives apps with Kafka's default client settings a verdict, never a stall
error. Without static membership a SIGKILLed instance stays in its group until its session
times out (45 s by default): its replacement waits, the output stays quiet and nothing is
committed, and the harness asks the group why (slow, not stalled). Each app is killed once,
where its guarantee shows (``kill:<api>:1``: SIGKILLed as it sends that request):

- at most once (examples/torture/commit_first_app.py --kafka-defaults): killed as it sends
  the output of a batch whose offsets it committed first: that batch is lost;
- at least once (examples/torture/at_least_once_app.py): killed as it commits the offsets of
  a batch it wrote: the batch is written again;
- exactly once (examples/torture/exactly_once_app.py --kafka-defaults): killed as it commits
  its first transaction: the transaction is aborted, the batch read again, exact.
"""
from __future__ import annotations

import sys

import pytest

from labkit.torture import harness
from tests.test_harness import APPS, no_process_left_behind  # noqa: F401 (autouse here too)


@pytest.mark.parametrize("app, fault, verdict", [
    (["commit_first_app.py", "--kafka-defaults"], "kill:produce:1", "at most once"),
    (["at_least_once_app.py"], "kill:offsetcommit:1", "at least once"),
    (["exactly_once_app.py", "--kafka-defaults"], "kill:endtxn:1", "exactly once"),
])
def test_an_app_with_kafkas_defaults_is_slow_not_stalled(app, fault, verdict, cluster):
    # a stall time shorter than the 45 s the replacement waits: the harness must tell that
    # wait from a stall (its default, 70 s, outlasts the session and would not have to)
    run = harness.torture([sys.executable, str(APPS / app[0]), *app[1:]], records=400, kills=0,
                          fault=fault, timeout=180, stall_s=30, cluster=cluster)
    assert run.verdict == verdict, run.summary()
    assert run.restarts == 1 and run.faults_fired, run.summary()  # killed once, by the wire
    assert run.waited and not run.stalls and not run.notes, run.summary()
    if verdict == "exactly once":
        assert run.report.aborted_in_log > 0, run.summary()  # its open transaction, aborted
