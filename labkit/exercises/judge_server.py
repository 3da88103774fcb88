"""A process per kernel that forks the capstone's judged runs, the judge already imported.

Started as a fresh process, each judged run spent about half a second of CPU importing the
judge (pandas, every experiment) before it ran anything: half of its own CPU, and ten of them
a verdict (docs/measurements.md, stop 58). This server (``labkit.forkserver``) imports it
once, at its start (``PRELOAD``), and forks a run per request. Each run forks its loop's
instances from a server of its own (``forks``), with confluent_kafka and the runner already
imported too (stop 59).

The server is its own process group: a terminal's Ctrl-C does not reach it. It dies with
the kernel, and each run with it: no judged run, nor any instance of one, outlives the
kernel, however the kernel ends.
"""
from __future__ import annotations

from pathlib import Path

from labkit import forkserver

# imported (and called, with ":") once by the server: the judge, every experiment, and what
# a loop's instance runs
PRELOAD = ("labkit.exercises.side_by_side", "labkit.experiments.registry:catalog",
           "labkit.faults.runner", "confluent_kafka")
CLIENT = forkserver.Client("labkit.exercises.judge_server", PRELOAD)


def fork(target: str, argument: object, run_dir: Path, keep_fd: int) -> forkserver.Forked:
    """Fork a run of ``target(argument)`` that logs to ``run_dir``/run.log, writes its exit
    code to ``run_dir``/returncode and holds ``keep_fd`` (its slot's lock) as long as it
    lives; its instances are forked too."""
    return CLIENT.fork(target, argument, log=run_dir / "run.log",
                       status=run_dir / "returncode", keep_fds=(keep_fd,), forks=True)


if __name__ == "__main__":
    forkserver.main(list(PRELOAD))
