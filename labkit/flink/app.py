"""A Flink job as an app for ``labkit torture``: one start of it from the LABKIT_* environment
the harness sets, restored from the latest retained checkpoint of the run at each start, as
a supervisor would restart it.

    python -m labkit.torture.apps flink exactly_once --interval-ms 500 --work-ms 20
    python -m labkit.torture.apps flink at_least_once --job my_job.py --function my_job

The harness starts the command, SIGKILLs it at random and starts it again. Each start finds
the run's folder (beside the harness's history file), restores the latest completed
checkpoint there, writes its settings and replaces itself (exec) with PyFlink's python
running the job, so the harness's SIGKILL to the start's process group takes the job's
Python and its JVM. The job reads LABKIT_INPUT_TOPIC (read_committed), writes
LABKIT_OUTPUT_TOPIC, commits its source offsets to LABKIT_GROUP_ID at each checkpoint (how the
harness sees its progress) and names its sink's transactions after LABKIT_TRANSACTIONAL_ID.

``--work-ms`` runs the lab's job with that much work per payment (the reference job's
``add_fee`` made to sleep first), so a small input lasts several checkpoints and the kills
land mid-stream.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from labkit import settings
from labkit.checking import history
from labkit.flink import checkpoints, environment
from labkit.flink.clients import GUARANTEES
from labkit.flink.process import REFERENCE_JOB, job_command
from labkit.flink.runsetup import check_job
from labkit.kafka import javaconfig

FOLDER = "flink"  # in the harness's run folder: checkpoints, each start's settings and logs
SLOW_LINE = "    payment = json.loads(value)\n"


def slowed(work_ms: float) -> str:
    """The lab's job with ``work_ms`` of work (a sleep) per payment before its fee."""
    code = REFERENCE_JOB.read_text()
    if code.count(SLOW_LINE) != 1:
        raise RuntimeError(f"{REFERENCE_JOB.name} changed: its add_fee no longer has "
                           f"{SLOW_LINE.strip()!r} once")
    return code.replace(SLOW_LINE, f"    time.sleep({work_ms / 1000!r})\n{SLOW_LINE}").replace(
        "import json\n", "import json\nimport time\n", 1)


def start(guarantee: str, interval_ms: int, timeout_ms: int, work_ms: float,
          job_file: Path | None, function: str) -> tuple[list[str], dict[str, str]]:
    """This start's command and environment: the run's folder found, the latest
    checkpoint chosen, the settings written."""
    env = os.environ
    folder = Path(env[history.ENV_FILE]).parent / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    if job_file is None:
        job_file = folder / "job.py"
        job_file.write_text(slowed(work_ms) if work_ms else REFERENCE_JOB.read_text())
    check_job(job_file.read_text(), function)
    last = checkpoints.latest(folder / "checkpoints")
    bootstrap = env[settings.BOOTSTRAP]
    params = {
        "bootstrap": bootstrap, "input_topic": env[settings.INPUT_TOPIC],
        "output_topic": env[settings.OUTPUT_TOPIC], "group_id": env[settings.GROUP_ID],
        "transactional_id_prefix": env[settings.TRANSACTIONAL_ID],
        "delivery_guarantee": guarantee,
        "checkpoint_dir": (folder / "checkpoints").as_uri(),
        "checkpoint_interval_ms": interval_ms, "transaction_timeout_ms": timeout_ms,
        "restore_from": str(last.path) if last else None,
        "connector_jars": [p.as_uri() for p in environment.connector_jars()],
        "kafka_properties": javaconfig.for_client(bootstrap)}
    name = f"start-{len(list(folder.glob('start-*.settings.json'))) + 1}"
    print(f"{name}: " + (f"restoring checkpoint {last.id} ({last.path})" if last else
                         "fresh: no checkpoint yet"), flush=True)
    return job_command(job_file, function, params, folder, name)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m labkit.torture.apps flink",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("guarantee", choices=GUARANTEES)
    parser.add_argument("--interval-ms", type=int, default=500, help="checkpoint interval")
    parser.add_argument("--timeout-ms", type=int, default=60_000,
                        help="the sink's transaction.timeout.ms")
    parser.add_argument("--work-ms", type=float, default=0.0,
                        help="work per payment in the lab's job (a sleep)")
    parser.add_argument("--job", type=Path, help="a file defining the job function")
    parser.add_argument("--function", default="fee_job", help="the job function's name")
    args = parser.parse_args(argv)
    if args.job is not None and args.work_ms:
        parser.error("--work-ms slows the lab's job: leave it out with --job")
    command, env = start(args.guarantee, args.interval_ms, args.timeout_ms, args.work_ms,
                         args.job, args.function)
    os.chdir(Path(command[-1]).parent)
    os.execvpe(command[0], command, env)  # the harness's SIGKILL reaches the JVM too
