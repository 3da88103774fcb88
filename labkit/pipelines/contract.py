"""The contract between ``labkit torture`` and the app under test (docs/torture.md, "Torture
any app"): the environment the app is started with (where its input, output, group and
transactional id are, and the cluster's connection settings), the output it must write
(records that keep the input's ``id``, or a ``count`` per ``key``), and the audit that judges
that output. ``HarnessError``: a run that cannot be judged, with what to do."""
from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from labkit import settings

from labkit.checking import audit, history, reads
from labkit.checking.audit import AuditReport
from labkit.kafka import connection, javaconfig
from labkit.kafka import names as namespace

ENV_BOOTSTRAP, ENV_INPUT, ENV_OUTPUT = settings.BOOTSTRAP, settings.INPUT_TOPIC, settings.OUTPUT_TOPIC
ENV_GROUP, ENV_TRANSACTIONAL_ID = settings.GROUP_ID, settings.TRANSACTIONAL_ID
ENV_INSTANCE_ID = settings.INSTANCE_ID
CHECKS = ("records", "counts")
SCENARIO = "torture"
ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/[^\s:'\"=]+")  # in an argument: up to a space, : or quote
# The harness does not know what the app claims; the verdict says what it showed.
GUARANTEE = "unknown"


class HarnessError(ValueError):
    """The run could not be judged (bad input, an app that does not follow the contract);
    the message says what happened and what to do."""


def app_environment(bootstrap: str, names: dict[str, str],
                    run_dir: Path) -> dict[str, str | None]:
    """What the contract puts in the app's environment, over the lab's own (None: left out
    of it): the run's names, the history file, ``bootstrap``, and the cluster's connection
    settings as an app reads them: ``LABKIT_KAFKA_CONFIG`` (librdkafka names, for a Python
    app) and ``LABKIT_KAFKA_JAVA_CONFIG`` (the same settings in the Java client's names,
    ``labkit.kafka.javaconfig``, written to the run's directory). Neither when ``bootstrap``
    needs none (no LABKIT_KAFKA_CONFIG, or the fault proxy's plaintext side): then they are
    None, so the lab's own LABKIT_KAFKA_CONFIG does not reach an app talking plaintext."""
    env: dict[str, str | None] = {
        **names, history.ENV_FILE: str(run_dir / "history.jsonl"), ENV_BOOTSTRAP: bootstrap,
        # The harness's namespace, set even when empty: an app that names things through
        # the lab's helpers (client_config) would otherwise see LABKIT_BOOTSTRAP, take the
        # login name as its namespace (an external cluster's default) and join another group.
        settings.NAMESPACE: namespace.namespace(),
        settings.KAFKA_CONFIG: None, settings.KAFKA_JAVA_CONFIG: None}
    if connection.for_client(bootstrap):
        env[settings.KAFKA_CONFIG] = str(settings.current().kafka_config.resolve())
        env[settings.KAFKA_JAVA_CONFIG] = str(javaconfig.write(run_dir / "client-java.properties",
                                                               bootstrap))
    return env


def checked_command(command: Sequence[str]) -> list[str]:
    """The command as strings, refused (HarnessError) if it is empty or not found."""
    command = [str(c) for c in command or ()]
    if not command:
        raise HarnessError("no command to torture: put the app's command after `--`, e.g. "
                           "labkit torture --kills 3 -- python examples/torture/exactly_once_app.py")
    if shutil.which(command[0]) is None:
        raise HarnessError(f"command not found: {command[0]!r} (not an executable file or on "
                           "PATH); give the full path or fix PATH")
    return command


def shown(command: Sequence[str]) -> str:
    """The command as its progress line shows it: each absolute path by its last part (the
    parts of a classpath too), so a notebook's stored output names no directory of this
    machine (the run's facts keep the whole command)."""
    return shlex.join(ABSOLUTE_PATH.sub(lambda m: Path(m.group(0)).name or m.group(0), arg)
                      for arg in command)


@dataclass(frozen=True)
class ContractAudit:
    """The torture's checker: the existing checkers on the output topic, after checking it
    follows the contract (``check``: "records" or "counts"); ``fault`` as the report names
    it. Its read goes through ``labkit.checking.reads`` (kept in the run's history): a
    stored run is checked again from it."""

    check: str
    fault: str | None = None

    replayable: ClassVar[bool] = True

    def __call__(self, run: Any) -> AuditReport:
        try:
            read = reads.topic(run, "output")
        except ValueError as exc:  # json.JSONDecodeError: a value that is not JSON
            raise HarnessError(f"output records must be JSON objects (the input's, with its "
                               f"id kept); reading {run.topics['output']} failed: {exc}") \
                from None
        report = audit_read(read, run.inputs, self.check)
        report.fault = self.fault
        return report


def audit_read(read: reads.Read, inputs: list[dict], check: str) -> AuditReport:
    """The existing checkers on the output topic as both readers got it, after checking it
    follows the contract."""
    records = read.committed
    field_name = "id" if check == "records" else "count"
    for r in records:
        if not isinstance(r.value, dict) or field_name not in r.value:
            raise HarnessError(
                f"output records must be JSON objects with {field_name!r} "
                + ("(the input record's id, kept)" if check == "records" else
                   "(the count so far for the record's key)")
                + f"; this one (partition {r.partition}, offset {r.offset}, key {r.key!r}) "
                f"has none: {json.dumps(r.value)[:300]}")
    if check == "records":
        return audit.audit_read(read, inputs, SCENARIO, GUARANTEE)
    report = audit.check_counts(SCENARIO, GUARANTEE, len(inputs), audit.expected_counts(inputs),
                                audit.last_value_per_key(records, "count"))
    report.aborted_in_log = len(read.everything) - len(records)
    return report
