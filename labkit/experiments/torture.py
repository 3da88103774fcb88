"""``labkit torture``: any app under kills and faults, judged by the one audit (Jepsen's
model for software the lab did not write), as an experiment like the others.

    run = experiments.run("torture", command=["python", "examples/torture/exactly_once_app.py"],
                          input=400, kills=3, seed=1)
    run.verdict, run.kills, run.restarts, run.stalls, run.summary(), run.to_json()

The workload is the contract's (``labkit.pipelines.contract``, docs/torture.md): an input
topic of ``input`` records with unique ids, an empty output topic, their names and the
group and transactional id in the app's environment (with several instances, each its own
transactional id and ``LABKIT_INSTANCE_ID``). The clients are the app
(``labkit.experiments.app_run``: its command supervised, restarted, stopped when its input
is consumed and its output quiet, its stalls told from its waits). The nemesis is a seeded
schedule (``labkit.faults.schedule``) of app kills and broker kills, and the fault proxy
for ``fault``. The checker reads the output as the contract says.

``schedule="production"`` puts the app under the judge's faults besides
(``labkit.faults.production``, the same objects the judge of a learner's loop uses): SIGKILLs
at random moments and as it sends its output and its commit, a produce ack lost and a record
refused, a member joining and one leaving, an instance frozen until the group moved on, the
offsets of a transaction refused, a successor with an instance's transactional id; one kind
alone by its name. The input then arrives while the app works (``labkit.experiments.feed``),
each fault a seeded 1-2 s after the app's next commit, ``kills`` and ``broker_kills``
added to them.
"""
from __future__ import annotations

import shlex
from dataclasses import asdict
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from labkit.checking.record import Presentation, RunRecord
from labkit.experiments import options as common
from labkit.experiments.app_run import STALL_S, AppClients
from labkit.experiments.feed import feed
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import Experiment, Option, register
from labkit.faults.broker_faults import KillBroker
from labkit.faults.faultspec import parse_fault_spec
from labkit.faults.nemesis import Nemesis
from labkit.faults.process_faults import Kill, any_running
from labkit.faults.production import BETWEEN_S, KINDS, production_faults
from labkit.faults.schedule import CLOCKS, Schedule
from labkit.faults.wire_faults import ProxyFault
from labkit.kafka import connection
from labkit.kafka.clientlog import client_config
from labkit.kafka.localcluster import LocalCluster
from labkit.pipelines import contract, data
from labkit.pipelines.contract import (CHECKS, ENV_GROUP, ENV_INPUT, ENV_INSTANCE_ID,
                                       ENV_OUTPUT, ENV_TRANSACTIONAL_ID, HarnessError)

NAME = "torture"
SCHEDULES = ("random", "production", *KINDS)  # production: every kind of KINDS at once
FEED_S = 12.0  # production's input arrives over this long (the app works while faults land)


def kill_window(value: Any) -> tuple[float, float]:
    """``(min, max)`` seconds from a tuple or the command line's ``MIN,MAX``."""
    try:
        window = tuple(float(x) for x in (value.split(",") if isinstance(value, str) else value))
        if len(window) != 2:
            raise ValueError
    except (TypeError, ValueError):
        raise HarnessError(f"--kill-after must be MIN,MAX seconds, e.g. 1.0,4.0 (not "
                           f"{value!r})") from None
    if not 0 < window[0] <= window[1]:
        raise HarnessError(f"kill_after must be (min, max) seconds with 0 < min <= max, "
                           f"not {window}")
    return window  # type: ignore[return-value]


def _check(command, kill_after, fault, **_) -> None:
    contract.checked_command(command)
    if fault is not None:
        try:
            parse_fault_spec(fault)
        except ValueError as exc:
            raise HarnessError(str(exc)) from None
    kill_window(kill_after)


def _clients(run) -> AppClients:
    o = run.o
    if o.broker_kills and not isinstance(run.cluster, LocalCluster):
        raise HarnessError("--broker-kills needs the lab's own local cluster (it SIGKILLs and "
                           f"restarts the broker process); {run.bootstrap} is an external "
                           "cluster (LABKIT_BOOTSTRAP). Unset LABKIT_BOOTSTRAP, or drop "
                           "--broker-kills.")
    names = {ENV_INPUT: run.topics["input"], ENV_OUTPUT: run.topics["output"],
             ENV_GROUP: run.group_id}
    production = o.schedule != "random"
    # the app's environment is made once the nemesis has set up (a proxy's bootstrap)
    return AppClients(contract.checked_command(o.command),
                      lambda: contract.app_environment(run.client_bootstrap, names, run.workdir),
                      members=[_member(run, i) for i in range(o.instances)],
                      timeout_s=o.timeout, stall_s=o.stall_s, label=contract.shown(o.command),
                      feed=(lambda run: feed(run, over_s=FEED_S, instances=o.instances))
                      if production else None)


def _member(run, i: int) -> dict:
    """Instance ``i``'s own environment: its transactional.id (the group's name for the
    first, as the contract has always said; ``<group>-<i>`` for the others) and a member id
    of its own for an app that wants static membership."""
    return {ENV_TRANSACTIONAL_ID: run.group_id if i == 0 else f"{run.group_id}-{i}",
            ENV_INSTANCE_ID: f"{run.group_id}-{i}"}


def _nemesis(o) -> Nemesis:
    committed = lambda run: run.progress.sample(fresh=True)[0]  # noqa: E731
    if o.schedule != "random":  # production's faults, and the kills asked for besides
        kind = "schedule" if o.schedule == "production" else o.schedule
        faults = [*production_faults(kind, o.seed, member=_member,
                                     transactional=ENV_TRANSACTIONAL_ID),
                  *(Kill(any_running(o.seed + n)) for n in range(o.kills)),
                  *(KillBroker(None, restart=True) for _ in range(o.broker_kills))]
        return Nemesis(ProxyFault(o.fault), Schedule(faults, BETWEEN_S, seed=o.seed,
                                                     clock="commit", offsets_committed=committed))
    schedule = Schedule([*(Kill(0) for _ in range(o.kills)),
                         *(KillBroker(None, restart=True) for _ in range(o.broker_kills))],
                        kill_window(o.kill_after), seed=o.seed, clock=o.kill_clock,
                        offsets_committed=committed)
    # Plaintext apps on a cluster that wants TLS or credentials talk through the proxy, whose
    # own side is plaintext.
    proxy = ProxyFault(o.fault) if o.fault else ProxyFault(
        only_if=lambda run: connection.for_client(run.bootstrap)) if o.plaintext else None
    return Nemesis(schedule, *([proxy] if proxy else []))


def _audit(o):
    return [contract.ContractAudit(o.check, o.fault)]


def _facts(run) -> dict:
    app: AppClients = run.clients
    (schedule,) = run.nemesis.of(Schedule)
    run.owns(*_app_topics(run.bootstrap, run.group_id))  # e.g. Kafka Streams' changelogs
    return {"kills": sum(isinstance(f, Kill) for f in schedule.done),
            "restarts": app.pool.result.attempts - len(app.pool.instances),
            "broker_kills": sum(isinstance(f, KillBroker) for f in schedule.done),
            "seconds": app.seconds, "command": run.o.command, "seed": run.o.seed,
            "run_dir": str(run.workdir), "restart_s": app.restart_s(),
            "notes": app.notes, "fault_stats": run.facts.get("fault_stats"),
            "partitions": run.o.partitions, "instances": run.o.instances,
            "topics": {"input": run.topics["input"], "output": run.topics["output"],
                       "kept": run.keep_topics},
            "stalls": app.stalls, "waited": app.waited,
            "faults_fired": [f.what for f in run.fired_faults]}


def _app_topics(bootstrap: str, group: str) -> list[str]:
    """Topics the app made for itself, named after its group the way Kafka Streams names its
    internal ones (``<application.id>-<store>-changelog``, ``...-repartition``)."""
    admin = AdminClient(client_config({"bootstrap.servers": bootstrap, "log_level": 0}))
    try:
        listed = admin.list_topics(timeout=5).topics
    except KafkaException:
        return []  # best effort, like the deletion itself
    return sorted(t for t in listed if t.startswith(f"{group}-")
                  and t not in (f"{group}-in", f"{group}-out"))


def _json(run: RunRecord) -> dict:
    d = run.report.to_dict()  # the keys of `labkit scenario --json`, in order
    d["anomalies"] = run.anomalies()
    f = run.facts
    return {**d, **{k: f[k] for k in ("kills", "restarts", "broker_kills", "seconds",
                                      "command", "seed", "run_dir", "notes", "fault_stats",
                                      "partitions")}, "topics": dict(run.topics),
            "stalled": len(f["stalls"]), "stalls": [asdict(s) for s in f["stalls"]],
            "waited": f["waited"], "faults_fired": f["faults_fired"]}


def _summary(run: RunRecord) -> str:
    r, f = run.report, run.facts
    lines = [shlex.join(f["command"]),
             f"  kills={f['kills']} restarts={f['restarts']} broker_kills={f['broker_kills']} "
             f"seconds={f['seconds']}",
             f"  produced={r.produced} delivered_unique={r.delivered_unique} lost={r.lost} "
             f"duplicated={r.duplicated} reordered={r.reordered} "
             f"aborted_visible={r.aborted_visible} aborted_in_log={r.aborted_in_log}"]
    if f["stalls"]:  # a finding beside the audit's: the verdict is the output's alone
        lines.append(f"  stalled {len(f['stalls'])}× ("
                     + ", ".join(s.text() for s in f["stalls"]) + "; restarted)")
    if f["waited"]:
        lines.append("  slow, not stalled: " + "; ".join(f["waited"]))
    if run.options.get("schedule", "random") != "random" or run.options.get("fault"):
        lines += [f"  fault: {what}" for what in f["faults_fired"]]
    for name, found in run.anomalies().items():
        lines.append(f"  {name}: {found['count']}, e.g. {found['examples']}")
    lines += [f"  note: {n}" for n in f["notes"]]
    lines.append(f"  verdict: {run.verdict}")
    return "\n".join(lines)


register(Experiment(
    NAME, "any app (the command after --) under SIGKILLs, broker kills and network faults, "
    "judged by the audit of its output", stall_after=3600.0,
    pipeline="", group="Any app", options=(
        Option("command", None, "the app's command, after `--`", kind=list, positional=True),
        common.records(200, "input records (unique ids)"),
        Option("kills", 3, "SIGKILLs of the app at random times", kind=int, minimum=0),
        Option("schedule", "random", "random: --kills SIGKILLs and --broker-kills | production: "
               "the judge's faults besides (kills at random and as the app sends its output "
               "and its commit, a lost ack and a refused record, a member joining and one "
               f"leaving, a zombie, refused offsets, a fenced instance) | one kind of them: "
               f"{', '.join(KINDS)}", SCHEDULES),
        common.seed("the input and the kill times"),
        Option("broker_kills", 0, "SIGKILL + restart the lab broker (local lab only)", kind=int,
               minimum=0),
        Option("fault", None, "a network fault between app and broker, e.g. drop-ack:produce:3"),
        common.timeout(120.0),
        Option("check", "records", "records (output keeps input ids) | counts (a count per key)",
               CHECKS),
        Option("kill_after", "1.0,4.0", "MIN,MAX seconds between faults (seeded uniform)"),
        Option("kill_clock", "start", "start | commit: the delay counts from the app's "
               "(re)start or from its first offset commit after it", CLOCKS),
        Option("partitions", 1, "partitions of the input (and output)", kind=int, minimum=1),
        Option("instances", 1, "instances of the app at once, in one consumer group", kind=int,
               minimum=1),
        common.keep_topics(False),
        Option("plaintext", False, "the app reads no LABKIT_KAFKA_CONFIG: on a cluster with "
               "TLS/credentials, the lab's proxy stands in front of it", kind=bool),
        common.stall_s(STALL_S),
        Option("keep_workdir", True, "keep the run's directory (the app's logs, the history)",
               kind=bool, cli=False)),
    about="The lab writes --input JSON records with unique ids to a new input topic and "
          "passes LABKIT_BOOTSTRAP, LABKIT_INPUT_TOPIC, LABKIT_OUTPUT_TOPIC, LABKIT_GROUP_ID "
          "and LABKIT_TRANSACTIONAL_ID to the app, which writes records keeping each input "
          "id; with LABKIT_KAFKA_CONFIG set, also that file (and LABKIT_KAFKA_JAVA_CONFIG, the "
          "same settings in the Java client's names). Example: labkit torture --kills 3 -- "
          "python examples/torture/exactly_once_app.py",
    check=_check,
    workload=lambda o: Workload(NAME, (Topic("input", o.partitions,
                                             loaded=o.schedule == "random"),
                                       Topic("output", o.partitions)),
                                data.generate(o.records, seed=o.seed,
                                              keys=data.keys_for(o.partitions))),
    clients=_clients, nemesis=_nemesis, checkers=_audit, facts=_facts,
    presentation=Presentation(summary=_summary, json=_json)))
