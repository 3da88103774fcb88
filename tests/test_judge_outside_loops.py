"""Loops written outside the lab (tests/outside_loops.py: plain confluent-kafka, no labkit
import, no crash points) get a verdict from the judge, never an error:

- a right one with Kafka's default client settings (dynamic membership, a 45 s session):
  a SIGKILLed instance's replacement waits for its dead predecessor's session, and the judge
  says it waited (slow, not stalled); exact;
- the same loop with the lab's settings, under SIGKILLs at random moments and at its output
  and its commit: exact;
- the right loop read read_uncommitted downstream fails whether or not it flushes inside its
  transaction: the judge kills an instance as it sends its commit, so records of an aborted
  transaction are in the log whatever the loop flushed;
- a commit-first one (the input's offsets committed before its output is written) loses
  what it was writing when it was killed.
"""
from __future__ import annotations

import ast
import inspect

from labkit import experiments
from tests import outside_loops
from tests.outside_loops import (commit_first, exactly_once_defaults, exactly_once_flushing,
                                 exactly_once_lab_settings)


def judge(loop, bootstrap, **options):
    return experiments.run("judge", pipeline=loop, cluster=bootstrap, **options)


def test_the_loops_import_nothing_of_the_lab():
    tree = ast.parse(inspect.getsource(outside_loops))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"json", "confluent_kafka"}, imported


def test_a_right_loop_with_kafkas_defaults_is_slow_not_stalled(bootstrap):
    run = judge(exactly_once_defaults, bootstrap, phase="point", fault="kill:endtxn:1")
    assert run.report.exactly_once and not run.findings, run.summary()
    assert any("SIGKILLed as it sent EndTxn" in f for f in run.faults_fired), run.faults_fired
    assert run.waited and not run.stalls, run.summary()  # it waited for the dead member
    assert not run.notes, run.notes


def test_a_right_loop_with_the_labs_settings_passes_the_kills(bootstrap):
    run = judge(exactly_once_lab_settings, bootstrap, phase="kills")
    assert run.report.exactly_once and not run.findings, run.summary()
    assert len(run.faults_fired) >= 5 and not run.notes, run.summary()  # 4 kills landed


def test_read_uncommitted_downstream_fails_whether_or_not_the_loop_flushes(bootstrap):
    for loop in (exactly_once_lab_settings, exactly_once_flushing):
        run = judge(loop, bootstrap, phase="point", fault="kill:endtxn:1",
                    isolation="read_uncommitted")
        assert run.report.aborted_visible > 0, (loop.__name__, run.summary())
        # each aborted record read beside its committed copy: a duplicate, nothing lost
        assert run.report.lost == 0 and run.verdict == "incorrect", run.summary()


def test_a_commit_first_loop_loses_what_it_was_writing(bootstrap):
    run = judge(commit_first, bootstrap, phase="point", fault="kill:produce:1")
    assert run.report.lost > 0 and run.verdict == "at most once", run.summary()
    assert run.waited and not run.stalls, run.summary()  # Kafka's defaults: it waited
