"""A worker (``python -m labkit.faults.runner``) ends when the process supervising it dies,
even one started from a thread (no death signal): notebook 10 in a fresh clone's suite left
three judged instances running after its kernel, and with it their judged run, ended."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil

from labkit import proc

# A supervisor that starts one idle worker from a thread, says its pid, and waits to be killed.
SUPERVISOR = textwrap.dedent("""
    import subprocess, sys, threading, time
    from labkit import proc
    def start():
        w = proc.spawn([sys.executable, "-m", "labkit.faults.runner",
                        "tests.test_worker_orphans:idle"],
                       stdin=subprocess.PIPE, text=True)
        w.stdin.write("{}")
        w.stdin.close()
        print(w.pid, flush=True)
    t = threading.Thread(target=start)
    t.start(); t.join()
    time.sleep(600)
""")


def idle(seconds: float = 600.0) -> None:
    time.sleep(seconds)


def test_a_worker_ends_once_its_supervisor_is_killed():
    supervisor = proc.spawn([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = psutil.Process(int(supervisor.stdout.readline()))
        time.sleep(1.0)
        assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
        proc.kill([supervisor], tree=False)  # SIGKILL to it alone: no clean-up of its own
        supervisor.wait(10)
        gone, alive = psutil.wait_procs([worker], timeout=5)
        assert worker in gone, f"the worker outlived its supervisor: {alive}"
    finally:
        proc.kill([p for p in (supervisor, worker) if p is not None])
