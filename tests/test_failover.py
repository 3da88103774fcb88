"""A partition's leader dies after acknowledging records its followers never copied.

On a failure lab (a KRaft controller and 3 brokers of its own), every run audited from what
the partition holds afterwards: acks=1 loses exactly the records written while the
followers were frozen, the same number every time; acks=all with min.insync.replicas=2
loses none; an unclean election (min.insync.replicas=1) loses them even with acks=all.
"""
from __future__ import annotations

import difflib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from typer.testing import CliRunner

from labkit import experiments
from labkit.experiments import failover
from labkit.pipelines import delivery_reports

from labkit.kafka import topics
from labkit.kafka.failure_lab import failure_lab
from labkit.progress import wait_until
from labkit.cli import app
from labkit.exercises.failover import check_no_acknowledged_loss
from labkit.widgets.replicas import board_html
from tests.notebook_cells import as_cell, edited, read
from tests.test_stored_runs import checked_again, no_kafka  # noqa: F401 (a fixture)

RECORDS = 60
DURING_FREEZE = RECORDS // 2  # the second half is written while the followers are frozen
LABKIT = Path(sys.executable).with_name("labkit")


def test_acks_1_loses_what_only_the_dead_leader_had_the_same_number_every_time(
        failure_lab, tmp_path, no_kafka):
    seen: list = []  # the second run is watched, as notebook 03b's replica board does
    runs = [experiments.run("leader-failover", cluster=failure_lab, acks="1",
                            records=RECORDS),
            experiments.run("leader-failover", cluster=failure_lab, acks="1",
                            records=RECORDS, watch=seen.append)]
    for run in runs:
        assert run.acknowledged == RECORDS, run.summary()
        assert (run.lost_acknowledged, run.in_log) == (DURING_FREEZE, RECORDS - DURING_FREEZE), run.summary()
        # (a run whose frozen followers were fenced before the kill is made again)
        assert run.election.startswith("clean") and run.new_leader in failover.FOLLOWERS, \
            f"{run.summary()}\n    followers frozen {run.frozen_s} s; attempts: {run.attempts}"
    # stored and checked again without a broker (issue 50): what the producer was told and
    # the log, both kept in the history, give the live verdict and who acknowledged the lost
    again = checked_again(runs[0], runs[0].store(tmp_path / "failover.jsonl"), no_kafka)
    assert again.facts["lost_acknowledged_by"] == runs[0].lost_acknowledged_by, again.facts

    # what the watcher saw, from the brokers and the OS: the followers' processes stopped
    # while broker 1 still led, then broker 1 down and a follower leading
    frozen = [m for m in seen if m.processes == {1: "running", 2: "frozen", 3: "frozen"}]
    assert frozen and all(m.state.leader == 1 for m in frozen if m.state), seen
    killed = next(i for i, m in enumerate(seen)
                  if m.processes[1] == "down" and m.state and m.state.leader in (2, 3))
    # the replica board draws that moment: broker 1 down and out of the ISR, the new leader
    # running and in it, and one history row per change seen until then
    html = board_html(seen[:killed + 1])
    new_leader = seen[killed].state.leader
    assert 'data-broker="1" data-role="follower" data-sync="out" data-process="down"' in html, html
    assert (f'data-broker="{new_leader}" data-role="leader" data-sync="isr" '
            'data-process="running"') in html, html
    assert html.count('class="lk-replica-change"') == killed + 1


def test_acks_all_with_min_insync_2_loses_nothing_acknowledged(failure_lab):
    run = experiments.run("leader-failover", cluster=failure_lab, acks="all",
                          min_insync=2, records=RECORDS)
    # the producer was told nothing while the in-sync followers were frozen; its retries
    # went to the new leader, so every record is both acknowledged and there
    assert (run.acknowledged, run.in_log, run.lost_acknowledged, run.duplicated) == \
        (RECORDS, RECORDS, 0, 0), run.summary()
    assert f"{RECORDS // 2} acknowledged so far" in run.timeline(), run.timeline()


def test_an_unclean_election_loses_acknowledged_records_even_with_acks_all(failure_lab):
    """Run as the exercise of notebook 03b answered with Kafka's default (1): the check
    runs the real failover (40 records, unclean election on) and says what was lost."""
    verdict = check_no_acknowledged_loss(failure_lab, 1)
    assert not verdict.passed
    assert ("min.insync.replicas=1, 20 acknowledged records are gone "
            "(election: unclean (an out-of-sync replica))") in verdict.message, verdict.message
    assert "min.insync.replicas=2" not in verdict.message  # a hint, not the answer


def test_the_exercise_refuses_a_setting_the_topic_cannot_have_without_running(failure_lab):
    assert "fill in my_min_insync" in check_no_acknowledged_loss(failure_lab, None).message
    for bad in (0, 4, "2", True):
        assert "must be 1, 2 or 3" in check_no_acknowledged_loss(failure_lab, bad).message


def test_without_unclean_election_the_partition_waits_for_its_old_leader_and_loses_nothing(failure_lab):
    """No replica of the ISR left (min.insync.replicas 1, followers out of sync): a clean
    election has nobody to choose, so the partition stays offline until broker 1 is back."""
    seen: list = []
    run = experiments.run("leader-failover", cluster=failure_lab, acks="all",
                          min_insync=1, out_of_sync=True, records=RECORDS,
                          watch=seen.append)
    assert run.election.startswith("none") and run.new_leader == failover.LEADER, run.timeline()
    # watched live: the ISR shrank to the leader while the followers were frozen, then the
    # partition had no leader while broker 1 was down
    isrs = [set(m.state.isr) for m in seen if m.state is not None]
    assert {1, 2, 3} in isrs and {1} in isrs and isrs.index({1, 2, 3}) < isrs.index({1}), isrs
    assert any(m.state and m.state.leader is None and m.processes[1] == "down" for m in seen), seen
    assert (run.acknowledged, run.lost_acknowledged, run.duplicated) == (RECORDS, 0, 0), run.summary()


def test_03b_and_03c_show_the_reference_loop_line_for_line():
    """The loop the experiments run when no loop is given is the one both notebooks show
    (and pass as pipeline=); a lesson that drifts from it fails here, with the diff."""
    module = inspect.getsource(delivery_reports)
    reference = module[module.index("from labkit.kafka import topics"):].strip()
    for notebook in ("03b_when_the_broker_fails", "03c_when_the_network_takes_sides"):
        (shown,) = [c.source for c in read(notebook).cells
                    if c.cell_type == "code" and "def write_payments(" in c.source]
        assert shown.strip() == reference, "\n".join(difflib.unified_diff(
            reference.splitlines(), shown.splitlines(), lineterm=""))
        runs = [c.source for c in read(notebook).cells if c.cell_type == "code"
                and "experiments.run(" in c.source]
        assert runs and all("pipeline=write_payments, settings=producer_settings" in " ".join(
            r.split()) for r in runs), (notebook, runs)


def test_the_audit_counts_what_the_loop_was_told(failure_lab):
    """03b's loop run without its flush: it returns with answers it never served, so it was
    told of fewer acknowledgements, and the audit owes only those (the first half's, kept;
    the second half's it heard of, lost with the dead leader)."""
    cell = [c.source for c in read("03b_when_the_broker_fails").cells
            if c.cell_type == "code" and "def write_payments(" in c.source][0]
    hasty = as_cell(edited(cell, "    producer.flush(30)", "    pass"), "write_payments")
    run = experiments.run("leader-failover", cluster=failure_lab, acks="1", records=RECORDS,
                          pipeline=hasty)
    assert run.produced == RECORDS and run.acknowledged < RECORDS, run.summary()
    assert run.in_log == RECORDS - DURING_FREEZE, run.summary()
    assert run.lost_acknowledged == run.acknowledged - (RECORDS - DURING_FREEZE), run.summary()


def lab_jvms(home: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or ())
        if "java" in cmd and home in cmd:
            found.append(p)
    return found


def scenario_on_a_lab_of_its_own(tmp_path: Path, timeout_s: float, *args: str,
                                  stderr: list[str] | None = None) -> dict:
    """`labkit scenario ... --json` with LABKIT_BOOTSTRAP naming a shared cluster it must
    not touch; it says it starts its own lab and leaves no JVM and no lab directory.
    ``stderr``, if given, receives what the run printed there."""
    env = {**os.environ, "LABKIT_HOME": str(tmp_path), "LABKIT_BOOTSTRAP": "127.0.0.1:9"}
    out = subprocess.run([str(LABKIT), "scenario", *args, "--json"],
                         capture_output=True, text=True, env=env, timeout=timeout_s)
    assert out.returncode == 0, out.stderr
    assert "starts a Kafka of its own" in out.stderr
    assert lab_jvms(str(tmp_path)) == []
    assert list(tmp_path.glob("failure-failure_lab-*")) == []
    if stderr is not None:
        stderr.append(out.stderr)
    return json.loads(out.stdout)


def refused_before_any_broker(tmp_path: Path, scenario: str,
                              cases: list[tuple[list[str], str]]) -> None:
    """`labkit scenario SCENARIO ARGS` fails with the message each case names, and starts no
    broker first (bad input is refused before anything runs)."""
    env = {"LABKIT_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for args, says in cases:
        out = subprocess.run([str(LABKIT), "scenario", scenario, *args], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and says in out.stderr, (args, out.stderr)
        assert "Starting" not in out.stderr, (args, out.stderr)


def test_the_cli_runs_on_a_lab_of_its_own_and_leaves_no_jvm(tmp_path):
    printed: list[str] = []
    run = scenario_on_a_lab_of_its_own(tmp_path, 300, "leader-failover", "--acks", "1",
                                       "--records", str(RECORDS), stderr=printed)
    assert (run["produced"], run["lost_acknowledged"]) == (RECORDS, DURING_FREEZE), run
    # the partition's changes, printed live: the followers frozen under leader 1, then a
    # follower leading while broker 1 is down
    assert "leader 1, replicas [1, 2, 3], ISR [1, 2, 3]; brokers 1 running, 2 frozen, 3 frozen" \
        in printed[0], printed[0]
    assert f"leader {run['new_leader']}, replicas [1, 2, 3]" in printed[0], printed[0]
    assert "brokers 1 down, 2 running, 3 running" in printed[0], printed[0]


def test_a_run_that_fails_half_way_thaws_and_stops_every_broker(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="broker kill failed"):
        with failure_lab() as cluster:
            def broken_kill(node_id=None):
                raise RuntimeError("broker kill failed")
            monkeypatch.setattr(cluster, "kill", broken_kill)
            try:
                experiments.run("leader-failover", cluster=cluster, acks="1",
                                records=10)
            finally:
                # thawed on the way out: no broker is left stopped (SIGSTOP) while it runs
                assert not any(psutil.Process(b.pid).status() == psutil.STATUS_STOPPED
                               for b in cluster.brokers)
    assert lab_jvms(str(tmp_path)) == []


def test_labkit_inspect_shows_the_isr_shrink_and_the_eligible_leader_replica(failure_lab, monkeypatch):
    """Followers frozen past replica.lag.time.max.ms leave the ISR; with min.insync.replicas
    2 a follower that leaves it below that stays eligible to lead (KIP-966), as `labkit
    inspect` shows."""
    topic = "failover-inspect"
    failure_lab.wait_ready()  # a failover run before this one restarts its old leader in the background
    topics.create(failure_lab.bootstrap, topic, replica_assignment=[[1, 2, 3]],
                  config={"min.insync.replicas": "2"})
    monkeypatch.setenv("LABKIT_BOOTSTRAP", failure_lab.broker(failover.LEADER).address)
    shown = lambda: json.loads(CliRunner().invoke(app, ["inspect", topic, "--replicas", "--json"]).stdout)[0]
    assert (shown()["leader"], shown()["isr"]) == (1, [1, 2, 3])
    with failure_lab.frozen(*failover.FOLLOWERS):
        wait_until(lambda: shown()["isr"] == [1], "the ISR to shrink to the leader", 15)
        state = shown()
    # both followers, or the last to leave if they left one at a time
    assert state["elr"] and set(state["elr"]) <= {2, 3}, state
    text = CliRunner().invoke(app, ["inspect", topic, "--replicas"]).stdout
    assert text.startswith("partition 0: leader 1, replicas [1, 2, 3], ISR [1"), text


def test_without_java_the_scenario_says_what_is_needed_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_HOME", str(tmp_path))
    monkeypatch.setenv("LABKIT_JAVA", str(tmp_path / "no-java-here"))
    out = CliRunner().invoke(app, ["scenario", "leader-failover", "--acks", "1"])
    assert out.exit_code == 2, out.output
    assert "starts a Kafka of its own" in out.stderr
    assert "Java was not found" in out.stderr and "error:" in out.stderr
    assert list(tmp_path.glob("failure-failure_lab-*")) == []


@pytest.mark.parametrize("args, says", [
    (["--acks", "2"], "acks must be one of 0, 1, all"),
    (["--acks", "all", "--min-insync", "4"], "min_insync must be 1, 2 or 3"),
    ([], "needs --acks"),
    (["--acks", "1", "--guarantee", "exactly_once"], None),
])
def test_bad_settings_are_refused_before_any_broker_starts(tmp_path, monkeypatch, args, says):
    monkeypatch.setenv("LABKIT_HOME", str(tmp_path))
    out = CliRunner().invoke(app, ["scenario", "leader-failover", *args])
    if says is None:  # a guarantee means nothing here: refused rather than ignored
        assert out.exit_code == 2 and "--guarantee" in out.stderr, out.output
        return
    assert out.exit_code == 2 and says in out.stderr, out.output
    assert "starts a Kafka of its own" not in out.stderr


def test_coordinator_failover_refuses_too_few_records_before_any_broker_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_HOME", str(tmp_path))
    out = CliRunner().invoke(app, ["scenario", "coordinator-failover", "--records", "20"])
    assert out.exit_code == 2 and "records must be 50 or more" in out.stderr, out.output
    assert "starts a Kafka of its own" not in out.stderr


def test_every_experiment_shows_its_watchdog_limit_and_refuses_a_bad_one(tmp_path, monkeypatch):
    """--stall-after is every experiment's, with the experiment's own default in its help
    (read from the registry); a limit below 1 s is refused before any broker starts."""
    from labkit.experiments import catalog

    monkeypatch.setenv("LABKIT_HOME", str(tmp_path))
    for name, experiment in catalog().items():
        help_text = CliRunner().invoke(app, ["scenario", name, "--help"],
                                       env={"COLUMNS": "200"}).output
        words = " ".join(help_text.replace("│", " ").split())  # rich wraps the help in a box
        # one meaning: no option takes the watchdog's flag (an app's stall is --stall-s)
        assert not any(o.flag == "--stall-after" for o in experiment.options), name
        assert f"naming its last step (default {experiment.stall_after:g})" in words, (name, words)
    assert catalog()["spark-naive"].stall_after > catalog()["leader-failover"].stall_after
    out = CliRunner().invoke(app, ["scenario", "leader-failover", "--acks", "1",
                                   "--stall-after", "0"])
    assert out.exit_code == 2 and "--stall-after" in out.stderr, out.output
    assert "starts a Kafka of its own" not in out.stderr
