"""`labkit torture` on apps the lab did not write: a correct transactional app stays exact
under kills, a commit-before-flush app loses records, Kafka's own Java copier stays exact;
bad input gets a clear message and leaves no process behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from labkit.pipelines import contract
from labkit.torture import apps, harness
from labkit.checking.audit import REPORT_KEYS
from labkit.cli import app
from labkit.paths import project_root

LABKIT = Path(sys.executable).with_name("labkit")
APPS = project_root() / "examples" / "torture"
EXACT = [sys.executable, str(APPS / "exactly_once_app.py"), "--work-ms", "5"]
COMMIT_FIRST = [sys.executable, str(APPS / "commit_first_app.py"), "--work-ms", "5"]


def torture_processes() -> list[str]:
    """Processes the harness started in this test run that are still alive: they carry the
    contract's environment and this run's LABKIT_HOME (so a lab elsewhere is not counted)."""
    home = os.environ.get("LABKIT_HOME")
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            env = proc.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if contract.ENV_TRANSACTIONAL_ID in env and env.get("LABKIT_HOME") == home:
            found.append(" ".join(proc.info["cmdline"] or [])[:120])
    return found


def left_behind(find, wait_s: float = 2.0) -> list[str]:
    """What ``find()`` still lists after up to ``wait_s`` (a killed process may take a
    moment to be reaped)."""
    deadline = time.monotonic() + wait_s
    while find() and time.monotonic() < deadline:
        time.sleep(0.1)
    return find()


@pytest.fixture(autouse=True)
def no_process_left_behind():
    yield
    assert left_behind(torture_processes) == []


def test_a_transactional_app_is_exactly_once_under_kills(cluster):
    # 600 records take the app ~3 s of work: the seeded kills land while it works.
    result = harness.torture(EXACT, records=600, kills=3, seed=1, cluster=cluster)
    assert (result.kills, result.restarts) == (3, 3)
    assert result.verdict == "exactly once", result.summary()
    r = result.report
    assert (r.produced, r.delivered_unique, r.lost, r.duplicated) == (600, 600, 0, 0)
    assert result.anomalies() == {}
    assert len(result.restart_s) == 3
    assert result.stalls == []  # restarted by its kills, never for a stall
    events = [json.loads(line)["kind"] for line in
              (Path(result.run_dir) / "history.jsonl").read_text().splitlines()]
    assert events.count("killed") == 3 and events.count("started") == 4


def test_commit_before_flush_is_caught(cluster):
    # 600 records take the app ~3 s of work. Each kill lands 0.3-1 s after one of its
    # commits, so inside its work: counted from its start instead, all three once fell
    # before its first batch or after its last on a loaded machine (a start there takes
    # seconds), and the run was exact.
    result = harness.torture(COMMIT_FIRST, records=600, kills=3, seed=1, cluster=cluster,
                             kill_clock="commit", kill_after=(0.3, 1.0))
    assert result.kills == 3
    assert result.report.lost > 0 and result.report.duplicated == 0, result.summary()
    assert result.verdict == "at most once"
    lost = result.anomalies()["lost-write"]
    assert lost["count"] == result.report.lost and lost["examples"][0].startswith("r-")


def test_cli_json_has_the_scenario_keys_and_the_harness_keys(bootstrap):
    env = {**os.environ, "LABKIT_BOOTSTRAP": bootstrap}
    out = subprocess.run([str(LABKIT), "torture", "--records", "100", "--kills", "1", "--seed", "2",
                          "--partitions", "2", "--json", "--", *EXACT], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert list(d)[:len(REPORT_KEYS)] == list(REPORT_KEYS)
    assert {"kills", "restarts", "anomalies", "verdict", "seconds"} <= set(d)
    assert (d["verdict"], d["kills"], d["anomalies"], d["produced"]) == ("exactly once", 1, {}, 100)
    assert (d["partitions"], d["topics"]["kept"]) == (2, False)


def test_kafkas_own_transactional_copier_is_exactly_once_under_8_kills(cluster):
    # Kills 0.5-2 s after each start and 20,000 records, so all 8 land before the copier is
    # done even on a fast run (CI once saw it finish 10,000 records after 6 kills of 1-4 s).
    result = harness.torture(apps.copier_command(), records=20_000, kills=8, seed=1,
                             kill_after=(0.5, 2.0), timeout=240, cluster=cluster)
    assert result.kills == 8, result.notes
    assert result.verdict == "exactly once", result.summary()
    assert result.report.delivered_unique == 20_000


# ---------------------------------------------------------------- bad input


def test_no_command():
    result = CliRunner().invoke(app, ["torture", "--kills", "1"])
    assert result.exit_code == 2
    assert "no command to torture" in result.output and "after `--`" in result.output


def test_a_command_that_does_not_exist():
    with pytest.raises(contract.HarnessError, match="command not found: 'no-such-app'"):
        harness.torture(["no-such-app"])


def test_a_command_that_exits_at_once(cluster):
    crash = [sys.executable, "-c", "import sys; print('boom: no config file'); sys.exit(3)"]
    with pytest.raises(contract.HarnessError, match=r"exited with code 3 by itself[\s\S]*boom"):
        harness.torture(crash, records=10, kills=2, cluster=cluster)


def test_an_app_that_never_reads_its_input_and_its_children_are_stopped(cluster):
    # A shell whose background child would outlive a SIGKILL of the shell alone: the
    # harness kills the whole process group, at each kill and at the end.
    idle = ["sh", "-c", "sleep 3141.5 & sleep 2718.5"]
    with pytest.raises(contract.HarnessError, match="input was not consumed within 6 s") as exc:
        harness.torture(idle, records=10, kills=2, kill_after=(0.5, 1.0), timeout=6,
                        cluster=cluster)
    assert "$LABKIT_INPUT_TOPIC" in str(exc.value)
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "3141.5" in " ".join(p.info["cmdline"] or [])]


def test_an_app_that_writes_records_without_id(cluster, tmp_path):
    # It consumes everything (auto-commit) and writes what it read minus the id.
    script = tmp_path / "drops_ids.py"
    script.write_text(textwrap.dedent("""
        import json, os
        from confluent_kafka import Consumer, Producer
        env = os.environ
        c = Consumer({"bootstrap.servers": env["LABKIT_BOOTSTRAP"],
                      "group.id": env["LABKIT_GROUP_ID"], "auto.offset.reset": "earliest",
                      "auto.commit.interval.ms": 100})
        p = Producer({"bootstrap.servers": env["LABKIT_BOOTSTRAP"]})
        c.subscribe([env["LABKIT_INPUT_TOPIC"]])
        while True:
            for m in c.consume(100, timeout=0.2):
                record = json.loads(m.value())
                record.pop("id")
                p.produce(env["LABKIT_OUTPUT_TOPIC"], json.dumps(record).encode())
            p.flush()
    """))
    with pytest.raises(contract.HarnessError,
                        match=r"JSON objects with 'id'.*offset 0.*has none: \{\"amount_cents\""):
        harness.torture([sys.executable, str(script)], records=20, kills=0, cluster=cluster)


def test_an_unreachable_broker():
    env = {**os.environ, "LABKIT_BOOTSTRAP": "127.0.0.1:1"}
    out = subprocess.run([str(LABKIT), "torture", "--", *EXACT], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 2
    assert "127.0.0.1:1 is not reachable" in out.stderr


def test_broker_kills_need_the_labs_own_cluster(bootstrap, monkeypatch):
    monkeypatch.setenv("LABKIT_BOOTSTRAP", bootstrap)
    result = CliRunner().invoke(app, ["torture", "--broker-kills", "1", "--", *EXACT])
    assert result.exit_code == 2
    assert "needs the lab's own local cluster" in result.output
    assert "Unset LABKIT_BOOTSTRAP" in result.output


def test_a_bad_kill_window():
    result = CliRunner().invoke(app, ["torture", "--kill-after", "soon", "--", *EXACT])
    assert result.exit_code == 2 and "--kill-after must be MIN,MAX seconds" in result.output


COUNTING_APP = textwrap.dedent("""
    # A running count per key kept only in memory, input offsets committed as it goes: a
    # restart forgets the counts of everything already committed.
    import json, os, time
    from confluent_kafka import Consumer, Producer
    env = os.environ
    c = Consumer({"bootstrap.servers": env["LABKIT_BOOTSTRAP"], "group.id": env["LABKIT_GROUP_ID"],
                  "group.instance.id": "counter-1",  # a restart need not wait out the dead one
                  "auto.offset.reset": "earliest", "auto.commit.interval.ms": 100})
    p = Producer({"bootstrap.servers": env["LABKIT_BOOTSTRAP"]})
    c.subscribe([env["LABKIT_INPUT_TOPIC"]])
    counts = {}
    while True:
        for m in c.consume(10, timeout=0.2):
            key = json.loads(m.value())["key"]
            counts[key] = counts.get(key, 0) + 1
            time.sleep(0.01)
            p.produce(env["LABKIT_OUTPUT_TOPIC"], json.dumps({"key": key, "count": counts[key]}))
        p.flush()
""")


@pytest.mark.parametrize("kills", [0, 1])
def test_counts_are_compared_with_a_recount_of_the_input(cluster, tmp_path, kills):
    script = tmp_path / "count.py"
    script.write_text(COUNTING_APP)
    # 300 records take the app ~3 s: a kill 1.5-2 s after its start lands while it counts.
    result = harness.torture([sys.executable, str(script)], records=300, kills=kills, seed=4,
                             check="counts", kill_after=(1.5, 2.0), cluster=cluster)
    r = result.report
    assert sum(r.state_expected.values()) == 300  # the recount of the input
    if kills == 0:
        assert (result.verdict, r.lost, r.state_actual) == ("exactly once", 0, r.state_expected)
    else:  # the restart forgot the counts so far: every key ends short
        assert result.kills == 1 and r.lost > 0 and r.duplicated == 0, result.summary()
        assert result.verdict == "at most once"
        assert "lost-write" in result.anomalies() and "state-drift" in result.anomalies()


def test_a_network_fault_between_the_app_and_the_broker(cluster):
    # The 2nd Produce reaches the log but its ack is dropped: the app's producer retries,
    # and its idempotence (transactions imply it) keeps the log free of the copy. No kill
    # beside it: a kill while that Produce is on its way closes the app's connection before
    # the broker answers, leaving the proxy no answer to drop (the fault then never happens).
    result = harness.torture(EXACT, records=100, kills=0, seed=5, fault="drop-ack:produce:2",
                             cluster=cluster)
    assert result.report.fault == "drop-ack:produce:2"
    assert result.fault_stats["responses_dropped"] == 1  # the fault did fire
    assert result.fault_stats["requests"]["Produce"] >= 5  # 100 records, 20 per transaction
    assert (result.kills, result.verdict) == (0, "exactly once"), result.summary()


def test_a_bad_fault_spec_lists_the_forms():
    with pytest.raises(contract.HarnessError, match="drop-ack:produce:N"):
        harness.torture(EXACT, fault="explode:now")


def test_several_input_partitions_kept_topics_and_topics_deleted_by_default(cluster):
    from labkit.kafka import topics

    # Three input partitions (records spread by key), topics kept for a look afterwards.
    result = harness.torture(EXACT, records=300, kills=1, seed=3, partitions=3, keep_topics=True,
                             cluster=cluster)
    kept = result.topics
    try:
        assert kept["kept"] and result.partitions == 3
        assert topics.partitions_of(cluster.bootstrap, kept["input"]) == [0, 1, 2]
        by_partition = {p: 0 for p in range(3)}
        for r in topics.read(cluster.bootstrap, kept["input"]):
            by_partition[r.partition] += 1
        assert all(by_partition.values()) and sum(by_partition.values()) == 300, by_partition
        assert (result.kills, result.verdict) == (1, "exactly once"), result.summary()
        assert result.report.delivered_unique == 300
        # The harness's history shows the group's commits as the broker saw them, ending
        # with every partition's offsets committed to the input's end.
        progress = [e for e in (json.loads(line) for line in
                                (Path(result.run_dir) / "history.jsonl").read_text().splitlines())
                    if e["kind"] == "progress"]
        assert progress and progress[-1]["committed"] == progress[-1]["end"] == 300
    finally:
        topics.delete(cluster.bootstrap, kept["input"], kept["output"])
    # By default the run's topics are gone afterwards. (Listing every topic: asking for one
    # by name would let the lab broker auto-create it again.)
    result = harness.torture(EXACT, records=20, kills=0, cluster=cluster)
    assert result.verdict == "exactly once" and result.topics["kept"] is False
    listed = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10).topics
    assert result.topics["input"] not in listed and result.topics["output"] not in listed
