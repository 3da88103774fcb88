"""The Flink engine's parts that need no JVM: the checkpoint folder as Flink lays it out, the
sink's transactional ids, the latency quantiles, the job's entry point and its parameters,
the options a run refuses, and the pins that make PyFlink and its Kafka connector one
release. (tests/test_flink_engine.py runs the real job.)"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from labkit import experiments
from labkit.flink import aim, checkpoints, environment, visibility
from labkit.flink.process import JOBMAIN, REFERENCE_JOB
from labkit.flink.runsetup import JOB_PROVIDES, RunSetup, check_job
from labkit.pipelines import learner

ROOT = Path(__file__).resolve().parent.parent


def lay_out(root: Path, job: str, done: list[int], pending: list[int]) -> None:
    for n in done + pending:
        (root / job / f"chk-{n}").mkdir(parents=True)
    for n in done:
        (root / job / f"chk-{n}" / "_metadata").write_bytes(b"\x00")
    (root / job / "shared").mkdir(exist_ok=True)  # Flink's other folders are not checkpoints
    (root / job / "taskowned").mkdir(exist_ok=True)


def test_the_latest_completed_checkpoint_is_found_across_restarted_jobs(tmp_path):
    # the first job completed 3 and was killed during 4; its restart (a new job id) restored
    # 3 and numbers on from it
    lay_out(tmp_path, "a1", done=[3], pending=[4])
    lay_out(tmp_path, "b2", done=[5], pending=[6])
    latest = checkpoints.latest(tmp_path)
    assert (latest.id, latest.job_id, latest.path) == (5, "b2", tmp_path / "b2" / "chk-5")
    assert [(c.id, c.job_id) for c in checkpoints.pending(tmp_path)] == [(4, "a1"), (6, "b2")]
    assert [c.id for c in checkpoints.pending(tmp_path, after=5)] == [6]
    assert checkpoints.latest(tmp_path / "nothing") is None


def test_the_sinks_transactional_ids_are_named_per_checkpoint():
    # flink-connector-kafka's TransactionalIdFactory: prefix-subtask-checkpoint
    assert aim.transaction_of("flink-ab12", 7) == "flink-ab12-0-7"
    assert aim.transaction_of("alice.flink-ab12", 7, subtask=1) == "alice.flink-ab12-1-7"


def test_latency_quantiles_count_only_what_was_visible_before_the_first_kill():
    found = {f"p{i}": (10 * i, 10 * i + 100 + i) for i in range(100)}
    found["late"] = (0, 90_000)  # made visible only by a restart
    q = visibility.quantiles(found, visible_before_ms=50_000)
    assert q["records"] == 100 and 100 < q["p50_ms"] < q["p99_ms"] < 200
    assert visibility.quantiles(found)["p99_ms"] > 1000
    assert visibility.quantiles({})["records"] == 0


@pytest.mark.parametrize("options, message", [
    (dict(guarantee="exactly-once"), "guarantee must be one of exactly_once, at_least_once"),
    (dict(kill_at=["after-commit"]), "unknown kill point 'after-commit'"),
    (dict(kill_at="mid-checkpoint,after-commit"), "unknown kill point 'after-commit'"),
    (dict(checkpoint_interval_ms=50), "checkpoint_interval_ms must be 100 to 60000"),
    (dict(transaction_timeout_ms=500), "the broker refuses less than 1 s"),
    (dict(down_s=-1), "down_s must be 0 or more"),
    (dict(kill_at=["random"], down_s=[1, 2]), "one per kill"),
    (dict(rate=0), "rate must be 1 to 5000"),
])
def test_a_run_refuses_what_it_cannot_do_before_starting_anything(options, message):
    with pytest.raises(ValueError, match=message):  # no broker there: refused before any use
        experiments.run("flink-crash", cluster="127.0.0.1:1",
                        **{"guarantee": "exactly_once", **options})


def job_settings(tmp_path: Path, code: str, params: dict) -> Path:
    (tmp_path / "job.py").write_text(code)
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"code_file": str(tmp_path / "job.py"), "function": "my_job",
                                    "params": params,
                                    "outcome_file": str(tmp_path / "outcome.json")}))
    return settings


def test_the_job_function_gets_the_parameters_it_names(tmp_path):
    # jobmain imports nothing of labkit's and nothing of PyFlink's before the job does: the
    # lab's Python runs it here, a function that needs no Flink
    code = ("import json\n"
            "def my_job(output_topic, checkpoint_interval_ms):\n"
            "    open('called.json', 'w').write(json.dumps([output_topic, "
            "checkpoint_interval_ms]))\n")
    settings = job_settings(tmp_path, code, {"output_topic": "out", "input_topic": "in",
                                             "checkpoint_interval_ms": 500})
    done = subprocess.run([sys.executable, str(JOBMAIN), str(settings)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "called.json").read_text()) == ["out", 500]
    assert json.loads((tmp_path / "outcome.json").read_text()) == {"ok": True}


def test_a_job_that_asks_for_what_the_lab_does_not_provide_is_told_what_it_provides(tmp_path):
    settings = job_settings(tmp_path, "def my_job(bootstrap, parallelism):\n    pass\n",
                            {"bootstrap": "b", "input_topic": "in"})
    done = subprocess.run([sys.executable, str(JOBMAIN), str(settings)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    outcome = json.loads((tmp_path / "outcome.json").read_text())
    assert done.returncode != 0 and not outcome["ok"]
    assert outcome["error"] == ("TypeError: my_job asks for parallelism, which the lab does not "
                                "provide; it provides bootstrap, input_topic")


def test_the_reference_job_names_only_what_the_lab_provides(tmp_path):
    tree = ast.parse(REFERENCE_JOB.read_text())
    job = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "fee_job")
    assert [a.arg for a in job.args.args] == list(JOB_PROVIDES)
    # and what a run passes is that, no more, no less
    setup = RunSetup("127.0.0.1:1", source="in", sink="out", group="g", prefix="p",
                     folder=tmp_path, guarantee="exactly_once", interval_ms=1000,
                     timeout_ms=60_000)
    assert set(setup.params) == set(JOB_PROVIDES)
    assert all(Path(j.removeprefix("file://")).is_file() for j in setup.params["connector_jars"])


def test_pyflink_and_its_kafka_connector_are_one_flink_release():
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom = ET.parse(ROOT / "jvm" / "pom.xml").getroot()
    props = {e.tag.split("}")[1]: e.text for e in pom.find("m:properties", ns)}
    connector = props["flink.connector.kafka.version"]  # 5.0.0-2.2: for Flink 2.2
    major_minor = ".".join(environment.PYFLINK_VERSION.split(".")[:2])
    assert connector.endswith(f"-{major_minor}")
    assert f"apache-flink=={environment.PYFLINK_VERSION}" in environment.REQUIREMENTS
    assert f"apache-flink-libraries=={environment.PYFLINK_VERSION}" in environment.REQUIREMENTS
    assert all("==" in r for r in environment.REQUIREMENTS)  # every package pinned
    profile = pom.find("m:profiles", ns)
    ids = [p.find("m:id", ns).text for p in profile]
    assert "flink" in ids


@pytest.mark.parametrize("code, message", [
    ("def job(bootstrap:\n", "the job's code does not parse"),
    ("def other(bootstrap):\n    pass\n", "defines no function 'job' \\(it defines other\\)"),
    ("def job(bootstrap, parallelism, sink=None):\n    pass\n",
     "job asks for parallelism, which the lab does not provide"),
])
def test_a_learners_job_is_checked_without_pyflink(code, message):
    with pytest.raises(ValueError, match=message):
        check_job(code, "job")


@pytest.mark.parametrize("name", ["flink-crash", "flink-refused-start"])
def test_a_learners_job_is_refused_before_anything_starts(name):
    job = learner.from_text("def job(bootstrap, parallelism, sink=None):\n    pass\n", "job",
                            "<cell 1>")
    options = {"guarantee": "exactly_once"} if name == "flink-crash" else {}
    with pytest.raises(ValueError, match="job asks for parallelism, which the lab does not "
                                         "provide"):
        experiments.run(name, cluster="127.0.0.1:1", pipeline=job, **options)


def test_the_job_runs_its_cells_definitions_not_the_check_the_cell_ends_with(tmp_path):
    code = ("import json\n"
            "def my_job(output_topic):\n"
            "    open('called.json', 'w').write(json.dumps(output_topic))\n"
            "from labkit.exercises.no_such_check import check  # the kernel's, not the job's\n"
            "raise_if_run(my_job)  # the notebook's check, for the kernel only\n")
    settings = job_settings(tmp_path, code, {"output_topic": "out"})
    done = subprocess.run([sys.executable, str(JOBMAIN), str(settings)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "called.json").read_text()) == "out"


def test_latency_splits_into_the_write_and_the_wait_for_the_commit():
    # produced at 0, in the log 30 ms later, visible when its checkpoint's commit lands
    found = {f"p{i}": (0, 30 + 10 * i, 30) for i in range(50)}
    assert visibility.quantiles(found, of="written")["p50_ms"] == 30
    committing = visibility.quantiles(found, of="committing")
    assert committing["p50_ms"] == visibility.quantiles(found)["p50_ms"] - 30
    with pytest.raises(KeyError):
        visibility.quantiles(found, of="read")


def test_runs_side_by_side_raise_what_a_run_refused_once_all_have_ended():
    with pytest.raises(ValueError, match="guarantee must be one of"):
        experiments.run_together(
            dict(name="flink-crash", cluster="127.0.0.1:1", guarantee="exactly-once"),
            dict(name="flink-crash", cluster="127.0.0.1:1", guarantee="at_least_once",
                 checkpoint_interval_ms=50))
    with pytest.raises(ValueError, match="each with the experiment's name"):
        experiments.run_together(dict(guarantee="exactly_once"))
    later = experiments.start("flink-crash", cluster="127.0.0.1:1", guarantee="exactly_once",
                              kill_at="after-commit")
    with pytest.raises(ValueError, match="unknown kill point 'after-commit'"):
        later.result()
    assert later.done()


def test_the_exercise_check_wants_the_job_itself_before_anything_runs():
    from labkit.exercises.flink import check_flink_job

    verdict = check_flink_job("my_job", "127.0.0.1:1")  # no broker there: nothing ran
    assert not verdict.passed and "pass your function itself (my_job)" in verdict.message
