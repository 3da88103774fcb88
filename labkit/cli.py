"""`labkit`: the lab from a terminal, for instructors and scripts."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from labkit.kafka import cluster as lab
from labkit.paths import LabkitSetupError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="The delivery-semantics lab: real Kafka, broken on purpose.")


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


@app.command()
def setup() -> None:
    """Check Java and Maven, fetch the Kafka broker and Spark connector jars (once)."""
    from labkit.kafka import jvm

    try:
        java = jvm.check_java()
        for profile in jvm.PROFILES:
            jars = jvm.resolve(profile)
            typer.echo(f"{profile}: {len(jars)} jars in {jvm.jar_dir(profile)}")
    except LabkitSetupError as exc:
        _fail(str(exc))
    versions = jvm.pinned_versions()
    typer.echo(f"java: {java}; Kafka {versions['kafka.version']}, "
               f"Spark connector {versions['spark.version']} (Scala {versions['scala.binary.version']})")


@app.command()
def up(brokers: int = typer.Option(1, help="1, or 3 for the replication lessons"),
       port: int = typer.Option(0, help="port of the first broker (default: any free port)"),
       secure: bool = typer.Option(False, "--secure",
                                   help="SASL_SSL only (SCRAM-SHA-512, TLS, ACLs on); writes "
                                        "the client.properties LABKIT_KAFKA_CONFIG names")) -> None:
    """Start the lab cluster, or reuse the one already running; print its bootstrap address
    (with --secure, then the `export LABKIT_KAFKA_CONFIG=...` line its clients need)."""
    if brokers not in (1, 3):
        _fail(f"--brokers must be 1 or 3, not {brokers}")
    try:
        external = lab.external_from_env()
        if external:
            typer.echo(f"using the external cluster LABKIT_BOOTSTRAP={external.bootstrap}")
            typer.echo(external.bootstrap)
            return
        with lab.start_lock():
            running = lab.LocalCluster.attach()
            if running is None:
                running = lab.LocalCluster(brokers=brokers, port=port or None,
                                           detached=True, secure=secure).start()
            elif len(running.brokers) != brokers:
                _fail(f"a lab with {len(running.brokers)} broker(s) is already running; "
                      f"`labkit down` first to start one with {brokers}")
            elif secure and not running.secure:
                _fail("a plaintext lab is already running; `labkit down` first to start a "
                      "secure one")
            else:
                typer.echo(f"lab already running ({len(running.brokers)} broker(s))", err=True)
    except (lab.ClusterError, LabkitSetupError) as exc:
        _fail(str(exc))
    typer.echo(running.bootstrap)
    if running.secure:  # the line a learner pastes (or evals) before starting Jupyter
        typer.echo(f"export LABKIT_KAFKA_CONFIG={running.client_properties}")


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="machine-readable")) -> None:
    """Show the lab cluster: bootstrap, brokers, pids, data dir, up/down, the namespace."""
    from labkit import settings
    from labkit.kafka import names

    try:
        namespace, why = names.namespace_and_source()
        external = lab.external_from_env()
    except (lab.ClusterError, settings.SettingsError) as exc:  # a bad namespace or config file
        _fail(str(exc))
    running = external or lab.LocalCluster.attach()
    info = running.info() if running else {"up": False, "bootstrap": None, "brokers": []}
    info = {**info, "namespace": namespace, "namespace_from": why}
    if as_json:
        typer.echo(json.dumps(info))
        return
    shown = f"{namespace} (topics, groups, transactional ids: {namespace}.<name>)" if namespace \
        else "none (names unchanged)"
    if not info["up"]:
        typer.echo("lab: down (start it with `labkit up`)")
        typer.echo(f"namespace: {shown}, {why}")
        return
    typer.echo(f"lab: up   bootstrap: {info['bootstrap']}")
    typer.echo(f"namespace: {shown}, {why}")
    if info.get("external"):
        typer.echo("external cluster (LABKIT_BOOTSTRAP)")
        return
    typer.echo(f"data dir: {info['data_dir']}")
    if info.get("secure"):
        typer.echo("security: SASL_SSL only (SCRAM-SHA-512, TLS, ACLs on); clients need "
                   f"export LABKIT_KAFKA_CONFIG={info['client_properties']}")
    else:
        typer.echo("security: plaintext (no credentials)")
    for b in info["brokers"]:
        typer.echo(f"  broker {b['node_id']}  {b['address']}  pid {b['pid']}  "
                   f"{'alive' if b['alive'] else 'DEAD'}")


@app.command()
def down() -> None:
    """Stop the lab cluster and remove its data."""
    if lab.external_from_env_no_check():
        typer.echo("LABKIT_BOOTSTRAP is set: the external cluster is not the lab's to stop.")
        return
    running = lab.LocalCluster.attach()
    if running is None:
        typer.echo("nothing to stop: no lab cluster is running.")
        return
    running.stop()
    typer.echo(f"stopped {len(running.brokers)} broker(s).")


@app.command("clean-topics")
def clean_topics(yes: bool = typer.Option(False, "--yes", help="delete without asking")) -> None:
    """Delete every topic of your namespace (what the lessons left on a shared cluster)."""
    from labkit import settings
    from labkit.kafka import names, topics

    try:
        namespace = names.namespace()
        bootstrap = lab.running_or_fail().bootstrap
        if not namespace:  # without one, "mine" is every topic on the cluster
            _fail("no namespace is set, so every topic would count as yours: set "
                  "LABKIT_NAMESPACE (on the local lab, `labkit down` removes everything)")
        mine = topics.listing(bootstrap)
    except (lab.ClusterError, settings.SettingsError) as exc:
        _fail(str(exc))
    if not mine:
        typer.echo(f"no topics in namespace {namespace}.")
        return
    typer.echo(f"{len(mine)} topic(s) in namespace {namespace}: {', '.join(mine[:5])}"
               + (" ..." if len(mine) > 5 else ""))
    if not yes and not typer.confirm("delete them?"):
        raise typer.Exit(code=1)
    topics.delete(bootstrap, *mine)
    left = set(mine) & set(topics.listing(bootstrap))
    if left:
        _fail(f"{len(left)} topic(s) still there (e.g. {sorted(left)[0]}): the broker refused "
              "or timed out; run again, or ask the instructor (ACLs may forbid deleting)")
    typer.echo(f"deleted {len(mine)} topic(s).")


@app.command("crash-points")
def crash_points(as_json: bool = typer.Option(False, "--json", help="machine-readable")) -> None:
    """List the named crash points, one line each."""
    from labkit.faults.crashpoints import CRASH_POINTS

    if as_json:
        typer.echo(json.dumps([{"name": p.name, "description": p.description}
                               for p in CRASH_POINTS.values()]))
        return
    width = max(len(n) for n in CRASH_POINTS)
    for p in CRASH_POINTS.values():
        typer.echo(f"{p.name:<{width}}  {p.description}")


@app.command()
def scenario(
    name: str = typer.Argument(..., help="scenario, e.g. consumer, producer, consume-transform-produce"),
    guarantee: str = typer.Option(None, "--guarantee", "-g",
                                  help="at_most_once | at_least_once | exactly_once "
                                       "(every scenario but leader-failover, coordinator-failover, "
                                       "txn-timeout, poll-interval-zombie, reorder, "
                                       "producer-expiry and txn-id-expiry)"),
    crash_at: str = typer.Option(None, "--crash-at", help="a crash point (see `labkit crash-points`)"),
    fault: str = typer.Option(None, "--fault", help="a network fault, e.g. drop-ack:produce:1"),
    records: int = typer.Option(200, "--records", "-n", min=1, help="how many input records"),
    instances: int = typer.Option(1, "--instances", help="worker processes in one consumer group"),
    partitions: int = typer.Option(1, "--partitions", help="partitions of the input topic"),
    group_protocol: str = typer.Option("classic", "--group-protocol",
                                       help="classic | consumer (KIP-848)"),
    fencing: str = typer.Option(None, "--fencing",
                                help="zombie-rebalance and poll-interval-zombie only: group (KIP-447, "
                                     "default) | none"),
    trace: Path = typer.Option(None, "--trace",
                               help="write the workers' Kafka requests to this file (JSON lines)"),
    as_json: bool = typer.Option(False, "--json", help="print the audit as one JSON object"),
    ack_mode: str = typer.Option("explicit", "--ack-mode",
                                 help="share-group only: explicit | implicit acknowledgement"),
    poison: str = typer.Option(None, "--poison",
                               help="share-group only: a poison record, release | reject"),
    freeze: bool = typer.Option(False, "--freeze",
                                help="share-group only: freeze (SIGSTOP) the consumer at "
                                     "--crash-at past its record lock, then thaw it"),
    keep_topics: bool = typer.Option(False, "--keep-topics",
                                     help="keep the run's topics (deleted at its end by default)"),
    acks: str = typer.Option(None, "--acks", help="leader-failover only: 0 | 1 | all"),
    min_insync: int = typer.Option(1, "--min-insync",
                                   help="leader-failover only: the topic's min.insync.replicas"),
    unclean: bool = typer.Option(False, "--unclean",
                                 help="leader-failover only: unclean.leader.election.enable=true "
                                      "(the followers are left out of the ISR first)"),
    idempotent: bool = typer.Option(None, "--idempotent/--no-idempotent",
                                    help="reorder only: the producer's enable.idempotence"),
    out_of_sync: bool = typer.Option(False, "--out-of-sync",
                                     help="leader-failover only: freeze the followers until they "
                                          "leave the ISR (implied by --unclean)"),
    expiration_ms: int = typer.Option(None, "--expiration-ms",
                                      help="producer-expiry: the broker's producer.id."
                                           "expiration.ms (default 2000; Kafka's: 86400000); "
                                           "txn-id-expiry: its transactional.id.expiration.ms "
                                           "(default 2000; Kafka's: 604800000)"),
    stall_after: float = typer.Option(None, "--stall-after", min=1,
                                      help="coordinator-failover only: no batch sent or ended "
                                           "for this many seconds stops the run with an error "
                                           "naming its last step (default 120)"),
) -> None:
    """Run a scenario against the lab cluster (starting one if none runs) and print the audit.

    Its topics, group and transactional ids are in LABKIT_NAMESPACE (see `labkit status`)."""
    from labkit.experiments import scenarios

    if name != REORDER and idempotent is not None:
        _fail(f"--idempotent/--no-idempotent apply to {REORDER} only")
    if name != COORDINATOR_FAILOVER and stall_after is not None:
        _fail(f"--stall-after applies to {COORDINATOR_FAILOVER} only")
    if name not in (PRODUCER_EXPIRY, TXN_ID_EXPIRY) and expiration_ms is not None:
        _fail(f"--expiration-ms applies to {PRODUCER_EXPIRY} and {TXN_ID_EXPIRY} only")
    if name in (PRODUCER_EXPIRY, TXN_ID_EXPIRY):
        if guarantee is not None or crash_at or fault:
            _fail(f"{name} takes no --guarantee, --crash-at or --fault: its producers and its "
                  "fault are fixed; choose --expiration-ms")
        _expiry(name, expiration_ms, records, as_json)
        return
    if name == REORDER:
        if guarantee is not None or crash_at or fault:
            _fail(f"{REORDER} takes no --guarantee, --crash-at or --fault: its fault is fixed "
                  "(the 3rd Produce request fails, retriably, behind the 4th)")
        if idempotent is None:
            _fail(f"{REORDER}: choose --idempotent or --no-idempotent")
        _reorder(idempotent, records, as_json)
        return
    if name in (LEADER_FAILOVER, COORDINATOR_FAILOVER, TXN_TIMEOUT, POLL_ZOMBIE) \
            and guarantee is not None:
        _fail(f"{name} takes no --guarantee: leader-failover audits what acks and "
              "min.insync.replicas keep, the others run an exactly-once loop")
    if name in (COORDINATOR_FAILOVER, TXN_TIMEOUT, POLL_ZOMBIE) and (acks is not None or unclean or out_of_sync):
        _fail(f"--acks, --min-insync, --unclean and --out-of-sync apply to {LEADER_FAILOVER} only")
    if name == LEADER_FAILOVER:
        _leader_failover(acks, min_insync, unclean, out_of_sync, records, as_json)
        return
    if name == COORDINATOR_FAILOVER:
        _coordinator_failover(records, as_json, stall_after)
        return
    if name == TXN_TIMEOUT:
        _txn_timeout(records, as_json)
        return
    if name == POLL_ZOMBIE:
        _poll_zombie(fencing or "group", records, as_json)
        return
    if acks is not None or unclean or out_of_sync:
        _fail(f"--acks, --min-insync, --unclean and --out-of-sync apply to {LEADER_FAILOVER} only")
    if guarantee is None:
        _fail("choose a guarantee: --guarantee at_most_once | at_least_once | exactly_once")
    if instances > partitions and name != scenarios.SHARE:  # a share group splits records
        typer.echo(f"note: {instances} instances share {partitions} partition(s): "
                   f"{instances - partitions} instance(s) will stay idle", err=True)
    group = {"instances": instances, "partitions": partitions, "group_protocol": group_protocol}
    if trace is not None:
        group["trace"] = trace
    try:
        if name == scenarios.ZOMBIE:
            if (instances, partitions) != (1, 1) or crash_at or fault:
                raise ValueError(f"{name} always stalls one of two instances on one partition at "
                                 "a fixed point: drop --instances, --partitions, --crash-at and "
                                 "--fault; choose --fencing group | none")
            zombie = scenarios.zombie_rebalance(guarantee, fencing or "group", records,
                                                group_protocol=group_protocol,
                                                keep_topics=keep_topics)
            report = zombie.report
            if not as_json:
                typer.echo(f"zombie told: {zombie.zombie_error or 'nothing: its commit went through'}")
        elif name == scenarios.SHARE:
            if fault or fencing:
                raise ValueError(f"{name} takes --crash-at, --instances, --ack-mode, --poison")
            queue = scenarios.share_group(guarantee, crash_at, records=records, instances=instances,
                                          partitions=partitions, ack_mode=ack_mode, poison=poison,
                                          group_protocol=group_protocol, trace=trace,
                                          freeze=freeze, keep_topics=keep_topics)
            typer.echo(queue.to_json() if as_json else queue.summary())
            return
        elif fencing is not None:
            raise ValueError(f"--fencing applies to {scenarios.ZOMBIE} only")
        elif ack_mode != "explicit" or poison or freeze:
            raise ValueError(f"--ack-mode, --poison and --freeze apply to {scenarios.SHARE} only")
        else:
            report = scenarios.run(name, guarantee=guarantee, crash_at=crash_at, fault=fault,
                                   records=records, keep_topics=keep_topics, **group)
    except (ValueError, lab.ClusterError, LabkitSetupError) as exc:
        _fail(str(exc))
    _to_room(report)
    typer.echo(report.to_json() if as_json else report.summary())


LEADER_FAILOVER, COORDINATOR_FAILOVER = "leader-failover", "coordinator-failover"
TXN_TIMEOUT, POLL_ZOMBIE, REORDER = "txn-timeout", "poll-interval-zombie", "reorder"
PRODUCER_EXPIRY, TXN_ID_EXPIRY = "producer-expiry", "txn-id-expiry"


def _on_lab_cluster(check: Callable[[], None], run: Callable[[str], Any], as_json: bool,
                    text: Callable[[Any], str]) -> None:
    """A scenario with its own fixed fault, on the lab cluster: its settings checked before
    any broker starts, its audit to the room, then its JSON or ``text``."""
    try:
        check()
        result = run(lab.ensure().bootstrap)
    except (ValueError, lab.ClusterError, LabkitSetupError) as exc:
        _fail(str(exc))
    _to_room(result.report)
    typer.echo(result.to_json() if as_json else text(result))


def _expiry(name: str, expiration_ms: int | None, records: int, as_json: bool) -> None:
    """What the broker forgets: a producer's sequence numbers (producer-expiry) or a
    transactional.id (txn-id-expiry), each on a broker of its own (never the lab cluster:
    the settings are the broker's)."""
    from labkit.experiments import producer_expiry, txn_id_expiry

    module, run = ((producer_expiry, producer_expiry.producer_expiry) if name == PRODUCER_EXPIRY
                   else (txn_id_expiry, txn_id_expiry.txn_id_expiry))
    expiration_ms = module.EXPIRATION_MS if expiration_ms is None else expiration_ms
    try:
        module.check_settings(expiration_ms, records)
        result = run(expiration_ms, records, announce=lambda line: typer.echo(line, err=True))
    except (ValueError, lab.ClusterError, LabkitSetupError) as exc:
        _fail(str(exc))
    typer.echo(result.to_json() if as_json else result.summary())


def _reorder(idempotent: bool, records: int, as_json: bool) -> None:
    """One account's payments, the 3rd Produce failing behind the 4th, on the lab cluster."""
    from labkit.experiments import reorder

    _on_lab_cluster(lambda: reorder.check_records(records),
                    lambda bootstrap: reorder.reorder(bootstrap, idempotent, records), as_json,
                    lambda run: run.report.summary())


def _poll_zombie(fencing: str, records: int, as_json: bool) -> None:
    """A member slower than max.poll.interval.ms over one batch, on the lab cluster."""
    from labkit.experiments import poll_zombie

    def text(run) -> str:
        told = run.zombie_error or "nothing: its commit went through"
        return f"{run.report.summary()}\nzombie told: {told}; its next poll: {run.poll_after}"

    _on_lab_cluster(lambda: poll_zombie.check_settings(fencing, records),
                    lambda bootstrap: poll_zombie.poll_interval_zombie(bootstrap, fencing, records),
                    as_json, text)


def _txn_timeout(records: int, as_json: bool) -> None:
    """An exactly-once loop whose batch 2 outlasts transaction.timeout.ms, on the lab cluster."""
    from labkit.experiments import txn_timeout

    _on_lab_cluster(lambda: txn_timeout.check_records(records),
                    lambda bootstrap: txn_timeout.txn_timeout(bootstrap, records), as_json,
                    lambda run: f"{run.report.summary()}\nerrors: {', '.join(run.errors)}\n"
                                f"{run.timeline()}")


def _leader_failover(acks: str | None, min_insync: int, unclean: bool, out_of_sync: bool,
                     records: int, as_json: bool) -> None:
    """The broker-failure scenario, on a failure lab of its own (never the lab cluster)."""
    from labkit.experiments import failover

    if acks is None:
        _fail(f"{LEADER_FAILOVER} needs --acks 0 | 1 | all")
    try:
        failover.check_settings(acks, min_insync, records)
        with failover.failure_lab(announce=lambda line: typer.echo(line, err=True)) as cluster:
            # each change of the partition's leader, ISR and broker processes, live on stderr
            run = failover.leader_failover(cluster, acks, min_insync, unclean,
                                           out_of_sync or None, records,
                                           watch=lambda m: typer.echo(m.text(), err=True))
    except (ValueError, lab.ClusterError, LabkitSetupError) as exc:
        _fail(str(exc))
    typer.echo(run.to_json() if as_json else f"{run.summary()}\n{run.timeline()}")


def _coordinator_failover(records: int, as_json: bool, stall_after: float | None) -> None:
    """The transaction coordinator killed twice under an exactly-once loop, on a failure lab."""
    from labkit.experiments import coordinator_failover, failover
    from labkit.faults.watchdog import ExperimentStalled

    try:
        coordinator_failover.check_records(records)
        with failover.failure_lab(announce=lambda line: typer.echo(line, err=True)) as cluster:
            # the timeline line by line as it happens, on stderr beside the JSON
            run = coordinator_failover.coordinator_failover(
                cluster, records, on_step=lambda line: typer.echo(line, err=True),
                stall_s=stall_after or coordinator_failover.STALL_S)
    except (ValueError, lab.ClusterError, LabkitSetupError, ExperimentStalled) as exc:
        _fail(str(exc))
    typer.echo(run.to_json() if as_json else run.report.summary())


@app.command()
def inspect(topic: str = typer.Argument(..., help="topic to inspect"),
            as_json: bool = typer.Option(False, "--json", help="machine-readable"),
            share_group: str = typer.Option(None, "--share-group",
                                            help="instead: this share group's state of the "
                                                 "topic's partition 0 (start offset, acked, "
                                                 "archived, delivery counts)"),
            replicas: bool = typer.Option(False, "--replicas",
                                          help="instead: each partition's leader, replicas, ISR "
                                               "and eligible leader replicas (KIP-966)")) -> None:
    """Show a topic's record batches, markers and offsets (log start, LSO, high watermark)."""
    from labkit.kafka import inspect as inspector
    from labkit.kafka import protocol

    try:
        if share_group:
            from labkit.kafka.inspect.share import share_state

            with inspector.Inspector(lab.running_or_fail().bootstrap) as i:
                view = share_state(i, share_group, topic)
        elif replicas:
            with inspector.Inspector(lab.running_or_fail().bootstrap) as i:
                states = i.replica_states(topic)
            typer.echo(json.dumps([asdict(s) for s in states]) if as_json else
                       "\n".join(f"partition {s.partition}: {s.text()}" for s in states))
            return
        else:
            view = inspector.describe_topic(lab.running_or_fail().bootstrap, topic)
    except (ValueError, lab.ClusterError, LabkitSetupError, inspector.InspectError,
            ConnectionError, protocol.ProtocolError) as exc:  # e.g. no credentials: the fix
        _fail(str(exc))
    typer.echo(view.to_json() if as_json else view.to_text())


@app.command(context_settings={"allow_interspersed_args": False})
def torture(
    command: list[str] = typer.Argument(None, help="the app's command, after `--`"),
    records: int = typer.Option(200, "--input", "-n", help="input records (unique ids)"),
    kills: int = typer.Option(3, "--kills", help="SIGKILLs of the app at random times"),
    seed: int = typer.Option(0, "--seed", help="seeds the input and the kill times"),
    broker_kills: int = typer.Option(0, "--broker-kills",
                                     help="SIGKILL + restart the lab broker (local lab only)"),
    fault: str = typer.Option(None, "--fault",
                              help="a network fault between app and broker, e.g. drop-ack:produce:3"),
    timeout: float = typer.Option(120.0, "--timeout", help="seconds for the whole run"),
    check: str = typer.Option("records", "--check",
                              help="records (output keeps input ids) | counts (a count per key)"),
    kill_after: str = typer.Option("1.0,4.0", "--kill-after",
                                   help="MIN,MAX seconds between faults (seeded uniform)"),
    kill_clock: str = typer.Option("start", "--kill-clock",
                                   help="start | commit: the delay counts from the app's "
                                        "(re)start or from its first offset commit after it"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object"),
    partitions: int = typer.Option(1, "--partitions", help="partitions of the input (and output)"),
    keep_topics: bool = typer.Option(False, "--keep-topics",
                                     help="keep the run's input and output topics (deleted by default)"),
    plaintext: bool = typer.Option(False, "--plaintext",
                                   help="the app reads no LABKIT_KAFKA_CONFIG: on a cluster with "
                                        "TLS/credentials, the lab's proxy stands in front of it"),
    # the default is harness.STALL_S (harness is imported only when the command runs)
    stall_after: float = typer.Option(30.0, "--stall-after", min=1,
                                      help="an app alive but without an offset commit or output "
                                           "for this many seconds, its input not consumed, is "
                                           "reported as stalled and restarted (3 stalls: error)"),
) -> None:
    """Run any COMMAND as the pipeline under test: kill it at random, audit its output.

    The lab writes --input JSON records with unique ids to a new input topic and passes
    LABKIT_BOOTSTRAP, LABKIT_INPUT_TOPIC, LABKIT_OUTPUT_TOPIC, LABKIT_GROUP_ID and
    LABKIT_TRANSACTIONAL_ID to the app, which writes records keeping each input id;
    with LABKIT_KAFKA_CONFIG set, also that file (and LABKIT_KAFKA_JAVA_CONFIG, the same
    settings in the Java client's names).
    Example: labkit torture --kills 3 -- python examples/torture/exactly_once_app.py
    """
    from labkit.torture import harness

    try:
        window = tuple(float(x) for x in kill_after.split(","))
        if len(window) != 2:
            raise ValueError
    except ValueError:
        _fail(f"--kill-after must be MIN,MAX seconds, e.g. 1.0,4.0 (not {kill_after!r})")
    try:
        result = harness.torture(command or [], input=records, kills=kills, seed=seed,
                                 broker_kills=broker_kills, timeout_s=timeout, check=check,
                                 kill_after_s=window, fault=fault, partitions=partitions,
                                 keep_topics=keep_topics, kill_clock=kill_clock,
                                 plaintext=plaintext, stall_s=stall_after)
    except (harness.HarnessError, lab.ClusterError, LabkitSetupError) as exc:
        _fail(str(exc))
    _to_room(result.report)
    typer.echo(result.to_json() if as_json else result.summary())


def _to_room(report) -> None:
    """With LABKIT_ROOM set, the audit's counts go to the room's board too."""
    from labkit.room import board

    board.publish_audit(report)


room_app = typer.Typer(no_args_is_help=True, help="A room of learners on one cluster.")
app.add_typer(room_app, name="room")


@room_app.command("board")
def room_board(room: str = typer.Option("", help="the room (default: LABKIT_ROOM)"),
               host: str = typer.Option("127.0.0.1", help="the address to serve on (0.0.0.0: "
                                                          "the room's network)"),
               port: int = typer.Option(8770, help="the port (0: any free one)")) -> None:
    """Serve the room's board until Ctrl-C: one row per learner, one column per exercise,
    live. Learners set LABKIT_ROOM to the same name; their checks publish to it."""
    from labkit import settings
    from labkit.room import board

    room = room or settings.current().room
    if not room:
        _fail("name the room: --room NAME, or set LABKIT_ROOM (the learners set the same)")
    try:
        board.serve(lab.running_or_fail().bootstrap, room, host=host, port=port)
    except (lab.ClusterError, settings.SettingsError, OSError) as exc:
        _fail(str(exc))


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="machine-readable"),
           spark: bool = typer.Option(True, "--spark/--no-spark",
                                      help="also start a SparkSession (~10 s)")) -> None:
    """Preflight for a workshop: tools, jars, memory, the cluster, a produce/consume and a
    transaction round trip, Spark. Each line ok or the command that fixes it; exit 1 on any
    failure. Never starts a broker."""
    from labkit.room import doctor as preflight

    checks = preflight.run(spark=spark,
                           on_check=None if as_json else lambda c: typer.echo(c.line()))
    if as_json:
        typer.echo(json.dumps(preflight.as_json(checks), indent=2))
    raise typer.Exit(code=0 if all(c.ok for c in checks) else 1)


@app.command("spark-server")
def spark_server(port: int = typer.Option(15002, help="the Spark Connect port (127.0.0.1)"),
                 ui_port: int = typer.Option(0, "--ui-port", help="its Spark UI (default: any free port)")) -> None:
    """Run a Spark Connect server with the Kafka connector until Ctrl-C: one Spark for a room
    (learners set LABKIT_SPARK_REMOTE to the address it prints)."""
    from labkit.spark.connect import ConnectServer, ConnectServerError

    server = ConnectServer(port, ui_port=ui_port or None)
    try:
        server.start()
    except (ConnectServerError, lab.ClusterError, LabkitSetupError) as exc:
        _fail(str(exc))
    typer.echo(f"Spark Connect server ready in {server.startup_s:.0f} s (Ctrl-C stops it)\n"
               f"  export LABKIT_SPARK_REMOTE={server.url}\n"
               f"  Spark UI (every session's queries): {server.ui_url}\n"
               f"  log: {server.log_file}")
    code = server.serve()
    typer.echo("Spark Connect server stopped", err=True)
    if code:
        _fail(f"the server exited by itself (code {code}); its log {server.log_file} ends with:\n"
              f"{server.log_tail()}")


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":
    sys.exit(app())
