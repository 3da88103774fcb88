"""labkit.proc with real processes: a child dies with its owner, a recycled pid is not taken
for ours, SIGTERM escalates to SIGKILL for a child that ignores it, descendants included."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from labkit import proc
from labkit.kafka.localcluster import LocalCluster

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def _wait_gone(pid: int, started: float, deadline_s: float = 30.0) -> bool:
    deadline = time.monotonic() + deadline_s
    while proc.alive(pid, started) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not proc.alive(pid, started)


def test_a_spawned_child_dies_when_its_owner_is_sigkilled():
    # The owner starts two sleepers, one owned (the default) and one not, tells us who they
    # are, then SIGKILLs itself: no atexit, no cleanup code runs, only the kernel acts.
    quiet = "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"  # our pipes close at its death
    code = ("import json, signal, subprocess; from labkit import proc\n"
            f"a = proc.spawn({SLEEP!r}, group=True, {quiet})\n"
            f"b = proc.spawn({SLEEP!r}, group=True, owned=False, {quiet})\n"
            "print(json.dumps([[p.pid, proc.create_time(p.pid)] for p in (a, b)]), flush=True)\n"
            "proc.signal_self(signal.SIGKILL)\n")
    owner = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert owner.returncode == -signal.SIGKILL, owner.stderr
    (owned, owned_t), (free, free_t) = json.loads(owner.stdout)
    try:
        assert _wait_gone(owned, owned_t)  # PR_SET_PDEATHSIG: it died with its owner
        assert proc.alive(free, free_t)  # the one spawned owned=False (a detached lab) lives on
    finally:
        survivor = proc.process(free, free_t)
        proc.kill([survivor] if survivor else [])
    assert not proc.alive(free, free_t)


def test_a_recycled_pid_is_not_taken_for_our_broker(tmp_path):
    # A lab state file whose broker pid now belongs to another process: simulated by a
    # process whose command line even says kafka.Kafka, as a new broker of another lab
    # would, but whose start time is not the one the state file recorded.
    stranger = proc.spawn([*SLEEP, "kafka.Kafka"], group=True)
    started = proc.create_time(stranger.pid)
    try:
        assert proc.alive(stranger.pid, started)
        assert not proc.alive(stranger.pid, started - 1000)

        def write_state(create_time: float) -> None:
            broker = {"node_id": 1, "port": 1, "controller_port": 2, "pid": stranger.pid,
                      "dir": str(tmp_path / "node-1"), "create_time": create_time}
            (tmp_path / "cluster.json").write_text(json.dumps(
                {"brokers": [broker], "owner_pid": None, "detached": True, "started": 0}))

        write_state(started - 1000)  # our broker started then; this process did not
        assert LocalCluster.attach(tmp_path) is None  # not our lab: the stale state is removed
        assert not (tmp_path / "cluster.json").exists()
        assert stranger.poll() is None  # and the stranger was not signalled
        write_state(started)  # the same pid with its real start time is taken for ours
        attached = LocalCluster.attach(tmp_path)
        assert attached is not None and attached.brokers[0].pid == stranger.pid
        assert attached.info()["up"] is True
    finally:
        proc.kill([stranger])
    assert stranger.returncode == -signal.SIGKILL


def test_stop_escalates_from_sigterm_to_sigkill_for_the_whole_tree(tmp_path):
    # A child that ignores SIGTERM and has a grandchild that ignores it too; each speaks
    # once its handler is set, so the SIGTERM cannot arrive before it.
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if sys.argv[1:] == ['parent']:\n"
        "    kid = subprocess.Popen([sys.executable, __file__], stdout=subprocess.PIPE, text=True)\n"
        "    kid.stdout.readline()\n"
        "    print(kid.pid, flush=True)\n"
        "else:\n"
        "    print('ready', flush=True)\n"
        "time.sleep(120)\n")
    script_child = proc.spawn([sys.executable, str(script), "parent"], stdout=subprocess.PIPE,
                              text=True)
    grandchild = int(script_child.stdout.readline())
    grandchild_t = proc.create_time(grandchild)
    assert [p.pid for p in proc.descendants(script_child)] == [grandchild]
    killed = proc.stop([script_child], timeout_s=1.0)
    assert sorted(killed) == sorted([script_child.pid, grandchild])  # both needed the SIGKILL
    assert script_child.returncode == -signal.SIGKILL  # reaped through its Popen
    assert _wait_gone(grandchild, grandchild_t)
    script_child.stdout.close()

    polite = proc.spawn(SLEEP)  # the default SIGTERM action: it exits, no SIGKILL needed
    assert proc.stop([polite], timeout_s=30.0) == []
    assert polite.returncode == -signal.SIGTERM


def test_no_other_module_reads_proc_or_signals_by_pid():
    # One place for process hygiene: elsewhere a bare pid could be a recycled one. Popen's
    # own methods (kill, send_signal, wait) are fine: Popen never signals a reaped child.
    from pathlib import Path

    package = Path(proc.__file__).parent
    raw = ("/proc/", "os.kill(", "os.killpg(", "os.waitpid(", "preexec_fn=")
    offenders = [f"{path.relative_to(package.parent)}:{number}"
                 for path in package.rglob("*.py") if path.name != "proc.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if any(word in line for word in raw)]
    assert offenders == []


def test_stacks_show_where_a_python_process_waits_and_nothing_for_others():
    waiting = proc.spawn([sys.executable, "-c", "import time\n\ndef blocked_here():\n"
                          "    time.sleep(60)\n\nprint('ready', flush=True)\nblocked_here()\n"],
                         stdout=subprocess.PIPE, text=True)
    other = proc.spawn(["sleep", "60"])
    try:
        assert waiting.stdout.readline() == "ready\n"
        stacks = proc.stacks(waiting.pid)
        assert "blocked_here (<string>:4)" in stacks and "time_sleep" in stacks, stacks
        assert proc.stacks(other.pid) == ""  # neither Python nor a JVM
        assert proc.stacks(2 ** 22 + 7) == ""  # no such process
    finally:
        proc.stop([waiting, other], timeout_s=1.0)
        waiting.stdout.close()
