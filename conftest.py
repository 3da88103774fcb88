"""One real Kafka broker and one PostgreSQL for the whole test run: tests and notebooks
(nbval) share them.

With pytest-xdist (`make test` runs 2 workers, whole files to each) every worker has its
own broker and LABKIT_HOME, so workers never see each other's topics or processes.

It is started before collection-time work (pytest_sessionstart) so notebook kernels, which
are separate processes, find it too: they inherit LABKIT_HOME and ``labkit.kafka.cluster.ensure()``
attaches to it. With LABKIT_BOOTSTRAP set, everything runs against that external cluster.
Tests that kill or restart brokers start their own clusters and leave this one alone.
"""
from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

from labkit.kafka import cluster as lab
from labkit.kafka.localcluster import LocalCluster
from labkit.kafka.reach import ClusterError
from labkit import proc, settings
from labkit.storage import postgres
try:  # the solved-notebook runs below need the project's tests package (absent when this
    # file is copied elsewhere, as the leak test does)
    from tests import file_seconds
    from tests.solution_code import (SOLUTIONS, SOLVED, UNSOLVED, checks_in_place,
                                     exercise_indices, solved)
except ImportError:
    SOLUTIONS = file_seconds = None

_shared: dict[str, object] = {}


def _xdist_controller(config: pytest.Config) -> bool:
    """With pytest-xdist (-n N) the controller runs no test: only its workers need a broker."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shipped-notebooks", action="store_true",
                     help="nbval runs the notebooks as shipped (exercises unsolved, 'Not yet' "
                          "compared) instead of solved")
    parser.addoption("--lab-home", default=None,
                     help="use the lab running in this LABKIT_HOME (e.g. `labkit up --secure`, "
                          "with LABKIT_KAFKA_CONFIG set) instead of starting a broker")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _xdist_controller(session.config):
        return
    lab_home = session.config.getoption("--lab-home")
    if lab_home:  # someone else's lab: attached as the kernels will attach, never stopped
        os.environ["LABKIT_HOME"] = lab_home
        os.environ.setdefault("LABKIT_NAMESPACE", "")
        running = LocalCluster.attach()
        if running is None:
            raise pytest.UsageError(f"--lab-home {lab_home}: no lab runs there (`labkit up`)")
        try:
            if running.secure:  # fails at once, saying what to set, without LABKIT_KAFKA_CONFIG
                lab.check_credentials(running)
        except ClusterError as refused:
            raise pytest.UsageError(str(refused)) from None
        _shared["cluster"] = running
        _shared["attached"] = True
        _start_postgres()
        return
    # Notebook kernels inherit this home: they attach to the same broker, and the processes
    # they start are recognisable as this run's (see lab_processes).
    home = tempfile.mkdtemp(prefix="labkit-test-")
    os.environ["LABKIT_HOME"] = home
    # The suite's names are the lessons' own, also where a test points the CLI at this broker
    # through LABKIT_BOOTSTRAP (an external cluster's default namespace is the login name):
    # set empty, LABKIT_NAMESPACE means none. LABKIT_NAMESPACE=alice make test runs as alice.
    os.environ.setdefault("LABKIT_NAMESPACE", "")
    _start_postgres()
    external = lab.external_from_env()
    if external is not None:
        _shared["cluster"] = external
        return
    _shared["cluster"] = LocalCluster(brokers=1, home=home).start()


def _start_postgres() -> None:
    """One PostgreSQL per test process too, in its LABKIT_HOME (kernels attach to it through
    its state file), unless LABKIT_PG_DSN names one; one that is already running there (a
    lab of --lab-home's) is used and left running. A server that cannot start fails only
    the tests that ask for it (the pg_dsn fixture), with the reason."""
    if settings.current().pg_dsn:
        return
    try:
        with postgres.start_lock():
            running = postgres.LabPostgres.attach()
            _shared["postgres"] = running or postgres.LabPostgres().start()
            _shared["postgres_attached"] = running is not None
    except Exception as exc:  # noqa: BLE001 - reported by the fixture of the tests that need it
        _shared["postgres_error"] = exc


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    server = _shared.pop("postgres", None)
    if server is not None and not _shared.pop("postgres_attached", False):
        server.stop()
    shared = _shared.pop("cluster", None)
    if shared is not None and not _shared.pop("attached", False):
        shared.stop()


@pytest.fixture(scope="session")
def cluster() -> lab.Cluster:
    return _shared["cluster"]


@pytest.fixture(scope="session")
def bootstrap(cluster: lab.Cluster) -> str:
    return cluster.bootstrap


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The PostgreSQL the tests share: LABKIT_PG_DSN's, else this process's own server."""
    dsn = settings.current().pg_dsn
    if dsn:
        return dsn
    if "postgres_error" in _shared:
        pytest.fail(f"the lab's PostgreSQL did not start: {_shared['postgres_error']}")
    return _shared["postgres"].dsn()


@pytest.fixture(scope="module")
def three_brokers(tmp_path_factory: pytest.TempPathFactory):
    """A 3-broker cluster of the module's own, for tests that kill, stop or move leaders."""
    cluster = LocalCluster(brokers=3, home=tmp_path_factory.mktemp("three")).start()
    yield cluster
    cluster.kill()  # its data is thrown away: no controlled shutdown needed
    cluster.stop()


@pytest.fixture(scope="module")
def failure_lab():
    """A failure lab of the module's own (labkit.experiments.failover): a controller and brokers 1-3 to
    freeze and kill; stopped and removed after the module."""
    from labkit.kafka.failure_lab import failure_lab as private_lab

    with private_lab() as cluster:
        yield cluster


@pytest.fixture
def topic_name() -> str:
    """A fresh topic name per test, so tests never see each other's records."""
    return f"t-{uuid.uuid4().hex[:10]}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """nbval compares what a notebook *shows* (audits, verdicts, tables), not stderr: that
    stream carries progress spinners and librdkafka's log lines, whose timing varies."""
    for item in items:
        parent = getattr(item, "parent", None)
        skip = getattr(parent, "skip_compare", None)
        if skip is not None and "stderr" not in skip:
            parent.skip_compare = (*skip, "stderr")
    if file_seconds is not None:  # the project's own run (tests/file_seconds.py says why)
        # each xdist worker sorts its own collection, which must be the controller's
        workers = (getattr(config, "workerinput", {}).get("workercount")
                   or config.getoption("numprocesses", None) or file_seconds.WORKERS)
        file_seconds.sort_as_planned(items, workers=int(workers))


# ---------------------------------------------------------------- each test's CPU, for the suite's order
# With LABKIT_SUITE_CPU=1, the CPU a test used (its worker's whole process tree over the test's
# window) goes to the junit report, so tests/file_seconds.py can plan the next run's order.
_cpu_at_setup = pytest.StashKey[dict]()
_tree_cpu: list = []  # the worker's sampler, started at its first test (LABKIT_SUITE_CPU=1)


def _start_cpu_count(item: pytest.Item) -> None:
    if file_seconds is None or os.environ.get(file_seconds.MEASURE_ENV) != "1":
        return
    if not _tree_cpu:
        _tree_cpu.append(file_seconds.TreeCpu())
    item.stash[_cpu_at_setup] = _tree_cpu[0].mark()


def _record_cpu(item: pytest.Item) -> None:
    if _tree_cpu and _cpu_at_setup in item.stash:
        spent = _tree_cpu[0].since(item.stash[_cpu_at_setup])
        item.user_properties.append((file_seconds.CPU_PROPERTY, round(spent, 2)))


# ---------------------------------------------------------------- no notebook leaves processes behind
# Around each notebook run by nbval: the lab processes alive after its kernel has shut down
# that were not there before it started are leaks (brokers, Spark JVMs, crash-test workers).
LAB_PROCESS_MARKS = ("kafka.Kafka", "org.apache.spark", "pyspark", "labkit.faults.runner",
                     "labkit.exercises.judge_server", "labkit.spark",
                     "org.apache.kafka.connect.cli.ConnectDistributed",
                     "labkit/flink/jobmain.py", "org.apache.flink")
_before_notebook: dict[str, set[int]] = {}


def lab_processes() -> dict[int, str]:
    """Lab processes started by this test run: they inherited its LABKIT_HOME (kernels get
    it from pytest), which tells them apart from anything else running on the machine."""
    home = os.environ.get("LABKIT_HOME", "")
    found = {}
    # psutil (labkit.proc's base): another user's process reads as None, not an error
    for p in psutil.process_iter(["cmdline", "environ"]):
        if p.pid == os.getpid():
            continue
        cmdline = " ".join(p.info["cmdline"] or ())
        if ((p.info["environ"] or {}).get("LABKIT_HOME") == home
                and any(mark in cmdline for mark in LAB_PROCESS_MARKS)):
            found[p.pid] = cmdline[:160]
    return found


def _notebook_of(item) -> str | None:
    path = str(getattr(item, "fspath", ""))
    return path if path.endswith(".ipynb") else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _start_cpu_count(item)
    notebook = _notebook_of(item)
    if notebook and notebook not in _before_notebook:
        _before_notebook[notebook] = set(lab_processes())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the notebook's kernel is shut down inside this teardown when it is the last cell
    _record_cpu(item)
    notebook = _notebook_of(item)
    if not notebook or (nextitem is not None and _notebook_of(nextitem) == notebook):
        return
    before = _before_notebook.pop(notebook, set())
    deadline = time.monotonic() + 15  # JVMs exit when their pipe closes: give them a moment
    while True:
        leaked = {pid: cmd for pid, cmd in lab_processes().items() if pid not in before}
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if leaked:
        # clean up so one leak does not cascade into the next notebook
        proc.kill([p for p in map(proc.process, leaked) if p is not None])
        raise AssertionError(f"{os.path.basename(notebook)} left lab processes behind: "
                             + "; ".join(f"{pid}: {cmd}" for pid, cmd in leaked.items()))


# ---------------------------------------------------------------- each notebook runs once, solved
# nbval runs every notebook with its exercises solved (the code of notebooks/solutions/<name>.md
# inserted after the placeholders): each notebook executes once in CI, and that one run both
# compares every other cell's stored output and proves each exercise's check passes with the
# documented answer. The shipped copies stay unsolved: tests/test_exercise_solutions.py checks
# their stored "Not yet" without running them. `--shipped-notebooks` runs them as shipped.
# A notebook whose check comes cells after its exercise (10) runs as shipped here, its
# solution in its own run (test_exercise_solutions).

def exercise_verdict_problem(text: str) -> str | None:
    """Why a solved exercise cell's output is not a pass (None when it is one)."""
    if UNSOLVED in text:
        return f"the solved exercise's check printed {UNSOLVED!r}"
    if SOLVED not in text:
        return f"the solved exercise's check did not print {SOLVED!r}"
    return None


def _output_text(outputs) -> str:
    parts = []
    for out in outputs or ():
        parts.append(out.get("text", "") if out.get("output_type") == "stream"
                     else out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


try:
    import nbval.kernel
    from jupyter_client.manager import KernelManager
    from nbval.plugin import IPyNbCell, IPyNbFile
except ImportError:  # nbval is a dev dependency; without it there is nothing to swap
    IPyNbFile = None
else:
    class UnixSocketKernelManager(KernelManager):
        """A kernel that talks to nbval over Unix sockets in a directory of its own.

        Over TCP (the default), jupyter_client picks five free ports and lets them go before
        the kernel binds them. The suite's brokers, proxies and Spark drivers open ports all
        the time, and a port taken in between kills the kernel at start: a fresh-clone run
        lost notebook 11 to "Kernel died before replying to kernel_info" (nbval discards the
        kernel's stderr, so the port is the likely cause, not a proven one). A socket path
        that nobody else uses cannot be taken."""

        sockets = tempfile.TemporaryDirectory(prefix="nbval-kernels-")  # gone at exit

        def __init__(self, **kwargs):
            kwargs.setdefault("transport", "ipc")
            kwargs.setdefault("ip", os.path.join(self.sockets.name, uuid.uuid4().hex[:8]))
            super().__init__(**kwargs)

    nbval.kernel.KernelManager = UnixSocketKernelManager

    class SolvedExerciseCell(IPyNbCell):
        """An exercise cell run with its solution: its check must say "Well done" (its stored,
        unsolved output is not compared)."""

        def runtest(self) -> None:
            super().runtest()
            problem = exercise_verdict_problem(_output_text(self.test_outputs))
            if problem:
                self.raise_cell_error(problem, _output_text(self.test_outputs)[-2000:])

    class SolvedNotebook(IPyNbFile):
        """nbval's notebook, collected with each exercise cell solved."""

        def collect(self):
            items = list(super().collect())  # reads self.nb, one item per code cell
            if not checks_in_place(self.nb):  # runs as shipped; its solution is run by
                yield from items  # tests/test_exercise_solutions.py
                return
            name = Path(str(self.fspath)).stem
            answered = solved(self.nb, name)
            exercises = set(exercise_indices(self.nb))
            code = [i for i, c in enumerate(self.nb.cells) if c.cell_type == "code"]
            for item, index in zip(items, code):
                if index in exercises:
                    yield SolvedExerciseCell.from_parent(
                        self, name=item.name, cell_num=item.cell_num,
                        cell=answered.cells[index], options=defaultdict(bool, item.options, check=False))
                else:
                    yield item


@pytest.hookimpl(hookwrapper=True)
def pytest_collect_file(file_path, parent):
    outcome = yield
    if IPyNbFile is None or SOLUTIONS is None or parent.config.getoption("--shipped-notebooks"):
        return
    if not (SOLUTIONS / f"{file_path.stem}.md").exists():
        return
    outcome.force_result([SolvedNotebook.from_parent(parent, path=file_path)
                          if type(found) is IPyNbFile else found
                          for found in outcome.get_result()])
