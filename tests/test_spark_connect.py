"""Spark Connect (LABKIT_SPARK_REMOTE): notebook 08's Spark experiments against a shared server.

One Spark Connect server for the module (labkit.spark.connect.ConnectServer, 127.0.0.1, the
Kafka connector on its classpath). With the variable set, batch work (the audit's recount of
the input) runs on that server, and the crash experiments keep a local driver, because
they SIGKILL it. Judged on what is observable: the server's own list of the SQL it executed
(its Spark UI's REST API), the sink's table and the output topic (the audit), the exit
signal of the killed driver.
"""
from __future__ import annotations

import json
import signal
import socket
import urllib.request
from collections import Counter

import pytest

from labkit.pipelines import data
from labkit.kafka.ports import free_port
from labkit.spark import check, runner
from labkit.spark.connect import ConnectServer
from labkit import experiments
from labkit.spark.session import stop_remote
from tests.test_setup_errors import run_cli

pytestmark = pytest.mark.spark
CRASH_AT = "spark-after-sink-before-commit"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with ConnectServer(free_port(), log_dir=tmp_path_factory.mktemp("connect")) as srv:
        try:
            yield srv
        finally:
            stop_remote()  # end this process's Connect session while its server is still up


@pytest.fixture
def remote(server: ConnectServer, monkeypatch: pytest.MonkeyPatch) -> ConnectServer:
    monkeypatch.setenv("LABKIT_SPARK_REMOTE", server.url)
    return server


def kafka_scans(server: ConnectServer, topic: str) -> list[dict]:
    """The SQL executions the server ran that read ``topic`` from Kafka, by its own account."""
    with urllib.request.urlopen(f"{server.ui_url}/api/v1/applications", timeout=30) as r:
        app_id = json.load(r)[0]["id"]
    url = f"{server.ui_url}/api/v1/applications/{app_id}/sql?details=true&length=10000"
    with urllib.request.urlopen(url, timeout=30) as r:
        executions = json.load(r)
    return [e for e in executions if f"KafkaRelation(strategy=Subscribe[{topic}]"
            in e.get("planDescription", "")]


def test_recount_runs_on_the_server_without_a_local_jvm(remote, bootstrap, topic_name, monkeypatch):
    inputs = data.generate(30, seed=3)
    data.load_into_topic(bootstrap, topic_name, inputs, partitions=2)
    # No Java here: a local driver could not start, so an answer can only come from the server.
    monkeypatch.setenv("LABKIT_JAVA", "/nonexistent/bin/java")
    counts = runner.recount(bootstrap, topic_name)
    assert counts == dict(sorted(Counter(r["key"] for r in inputs).items()))
    scans = kafka_scans(remote, topic_name)
    assert len(scans) == 1 and scans[0]["status"] == "COMPLETED"
    assert "Spark Connect - session_id" in scans[0]["description"]


def test_notebook_08_experiments_against_the_server(remote, bootstrap, capsys):
    """08's naive sink and Kafka sink under the same crash: the killed driver is local
    (SIGKILL, the shared server lives on), the ground truth comes from the server, and the
    audit's numbers are the lesson's: 20 duplicated, none lost; 0 after a dedupe by id."""
    exps = []
    try:
        exps.append(experiments.run("spark-naive", cluster=bootstrap,
                                    guarantee="at_least_once",
                                    crash_at=CRASH_AT, records=60))
        exps.append(experiments.run("spark-kafka-sink", cluster=bootstrap,
                                    guarantee="at_least_once",
                                    crash_at=CRASH_AT, records=60,
                                    spare=False))
        for exp in exps:
            first = exp.run.attempts[0]
            assert first.crashed and first.returncode == -signal.SIGKILL
            assert len(exp.run.attempts) == 2
            assert (exp.report.lost, exp.report.duplicated) == (0, 20), exp.report.summary()
            # The recount of this input ran on the server, and it is the only Kafka scan of
            # the input there: the crashed and the restarted query ran on a local driver.
            scans = kafka_scans(remote, exp.job.topic)
            assert len(scans) == 1 and scans[0]["status"] == "COMPLETED"
        assert remote.alive
        assert "crash experiments SIGKILL their Spark driver: they run on a local one" in (
            capsys.readouterr().err)  # and the learner is told so
        kafka = exps[1]
        deduped = check.dedupe_by_id(kafka.output)
        after = check.audit_output("spark-kafka-sink + dedupe", "exactly_once", CRASH_AT,
                                   kafka.inputs, deduped, kafka.report.state_expected)
        assert (after.lost, after.duplicated, after.exactly_once) == (0, 0, True)
    finally:
        for exp in exps:
            exp.cleanup()
        runner.close_workers()


def test_bad_remote_address_and_busy_port_say_what_to_do(monkeypatch, tmp_path):
    """No Spark starts here: both are refused before anything is launched."""
    from labkit.paths import LabkitSetupError
    from labkit.spark import session

    monkeypatch.setenv("LABKIT_SPARK_REMOTE", "http://127.0.0.1:15002")
    with pytest.raises(LabkitSetupError, match=r"use sc://host:port"):
        session("bad-remote")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run_cli("spark-server", "--port", str(port), env={"LABKIT_HOME": str(tmp_path)})
    assert out.returncode == 2
    assert f"port {port} is in use" in out.stderr and "--port" in out.stderr
    assert not list(tmp_path.glob("spark-connect/*.log"))  # nothing was started
