"""`labkit`: the lab from a terminal, for instructors and scripts."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import typer

from labkit.cli.scenarios import scenario_app
from labkit.kafka import cluster as lab
from labkit.kafka.localcluster import LocalCluster
from labkit.kafka.reach import ClusterError
from labkit.paths import LabkitSetupError

class _LabGroup(typer.core.TyperGroup):
    """The root command: the commands below, and ``labkit torture``, which is the registry's
    ``torture`` experiment (its options and help come from there, as ``labkit scenario``'s)."""

    def list_commands(self, ctx) -> list[str]:
        return [*super().list_commands(ctx), "torture"]

    def get_command(self, ctx, name: str):
        if name == "torture":
            from labkit.cli.scenarios import command
            from labkit.experiments import catalog

            return command(catalog()["torture"])
        return super().get_command(ctx, name)


app = typer.Typer(cls=_LabGroup, add_completion=False, no_args_is_help=True,
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
        for profile in jvm.SETUP_PROFILES:
            jars = jvm.resolve(profile)
            typer.echo(f"{profile}: {len(jars)} jars in {jvm.jar_dir(profile)}")
    except LabkitSetupError as exc:
        _fail(str(exc))
    _save_startup_archives(java)
    versions = jvm.pinned_versions()
    typer.echo(f"java: {java}; Kafka {versions['kafka.version']}, "
               f"Spark connector {versions['spark.version']} (Scala {versions['scala.binary.version']})")


def _save_startup_archives(java: str) -> None:
    """Once: the classes a broker and a Spark driver load at start, saved for later starts
    (labkit.kafka.startup_archive). Without them the lab works, only starts slower."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from labkit.kafka import jvm, startup_archive, topics
    from labkit.pipelines import data
    from labkit.progress import status
    from labkit.spark.session import driver_classpath_key, make_startup_archive

    def broker_archive() -> None:
        with tempfile.TemporaryDirectory() as home, startup_archive.making("broker"):
            cluster = LocalCluster(brokers=1, home=home).start()
            try:  # the classes of a produce and a fetch too, not only of a start
                topics.create(cluster.bootstrap, "startup")
                data.load_into_topic(cluster.bootstrap, "startup", data.generate(100))
                topics.read(cluster.bootstrap, "startup")
            finally:
                cluster.stop()

    missing = [make for kind, classpath, make in (
        ("broker", jvm.classpath("kafka"), broker_archive),
        ("spark", driver_classpath_key(), make_startup_archive))
        if not startup_archive.archive_file(kind, java, classpath).is_file()]
    if not missing:
        return
    # Both JVMs at once: each spends seconds waiting on itself (a broker's start, a driver's
    # session). Measured: setup took 45 s instead of 53 s, bounded by the driver's 48 s.
    with status("Saving a broker's and a Spark driver's startup classes (once)"), \
            ThreadPoolExecutor(max_workers=2) as pool:
        for job in [pool.submit(make) for make in missing]:
            try:
                job.result()
            except Exception as exc:  # noqa: BLE001 - an archive only saves time; say why, go on
                typer.secho(f"note: no startup archive ({exc}); the lab works, its JVMs "
                            "start slower", err=True)


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
            running = LocalCluster.attach()
            if running is None:
                running = LocalCluster(brokers=brokers, port=port or None,
                                           detached=True, secure=secure).start()
                _start_postgres()
            elif len(running.brokers) != brokers:
                _fail(f"a lab with {len(running.brokers)} broker(s) is already running; "
                      f"`labkit down` first to start one with {brokers}")
            elif secure and not running.secure:
                _fail("a plaintext lab is already running; `labkit down` first to start a "
                      "secure one")
            else:
                typer.echo(f"lab already running ({len(running.brokers)} broker(s))", err=True)
    except (ClusterError, LabkitSetupError) as exc:
        _fail(str(exc))
    typer.echo(running.bootstrap)
    if running.secure:  # the line a learner pastes (or evals) before starting Jupyter
        typer.echo(f"export LABKIT_KAFKA_CONFIG={running.client_properties}")


def _start_postgres() -> None:
    """The lab's PostgreSQL beside a new lab, detached as its brokers are (none with
    LABKIT_PG_DSN). A server that cannot start here is a note: the Kafka lessons go on."""
    from labkit import settings
    from labkit.storage import postgres

    if settings.current().pg_dsn:
        return
    try:
        with postgres.start_lock():
            server = postgres.LabPostgres.attach() or postgres.LabPostgres(detached=True).start()
    except (postgres.PostgresError, LabkitSetupError) as exc:
        typer.secho(f"note: the lab's PostgreSQL did not start ({exc}); the lessons that need "
                    "it will say so", err=True)
        return
    typer.echo(f"PostgreSQL on 127.0.0.1:{server.port} (`labkit down` stops it too)", err=True)


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="machine-readable")) -> None:
    """Show the lab cluster: bootstrap, brokers, pids, data dir, up/down, the namespace."""
    from labkit import settings
    from labkit.kafka import names

    try:
        namespace, why = names.namespace_and_source()
        external = lab.external_from_env()
    except (ClusterError, settings.SettingsError) as exc:  # a bad namespace or config file
        _fail(str(exc))
    running = external or LocalCluster.attach()
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
    from labkit.storage import postgres

    if (pg := postgres.running()) is not None:
        typer.echo(f"  postgres  127.0.0.1:{pg.port}  pid {pg.pid}")


@app.command()
def down() -> None:
    """Stop the room's JupyterHub (its learners' servers and kernels), the lab cluster and
    the lab's PostgreSQL, and remove their data (learners' homes are kept)."""
    from labkit.room import hub
    from labkit.storage import postgres

    if hub.stop():  # first: its learners' kernels are clients of the brokers
        typer.echo("stopped the room's JupyterHub, its proxy and every learner's server.")
    if lab.external_from_env_no_check():
        typer.echo("LABKIT_BOOTSTRAP is set: the external cluster is not the lab's to stop.")
    else:
        running = LocalCluster.attach()
        if running is None:
            typer.echo("nothing to stop: no lab cluster is running.")
        else:
            running.stop()
            hub.remove_kafka_files()  # a room's CA and passwords: new ones at its next start
            typer.echo(f"stopped {len(running.brokers)} broker(s).")
    if postgres.stop():
        typer.echo("stopped the lab's PostgreSQL.")


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
    except (ClusterError, settings.SettingsError) as exc:
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


app.add_typer(scenario_app, name="scenario")


@app.command()
def check(path: Path = typer.Argument(..., help="a run stored with run.store(path)")) -> None:
    """Check a stored run again, offline: its checkers and the judge's findings re-run on
    the stored history (what the checkers read of Kafka after the run included); no Kafka
    is contacted. Prints the verdict and findings as the live run's summary did. A run whose
    checkers read anything else (a table, Spark, Flink, the torture's apps) is refused,
    naming the checker."""
    from labkit.checking.stored import NotReplayable, load
    from labkit.experiments.recheck import recheck, text

    try:
        record = recheck(load(path))
    except (NotReplayable, OSError, ValueError, KeyError) as exc:
        _fail(str(exc))
    typer.echo(text(record))


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
    except (ValueError, ClusterError, LabkitSetupError, inspector.InspectError,
            ConnectionError, protocol.ProtocolError) as exc:  # e.g. no credentials: the fix
        _fail(str(exc))
    typer.echo(view.to_json() if as_json else view.to_text())


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
    except (ClusterError, settings.SettingsError, OSError) as exc:
        _fail(str(exc))


@room_app.command("serve")
def room_serve(learners: int = typer.Option(3, help="learner01..NN: hub logins, Kafka users"),
               host: str = typer.Option("127.0.0.1", help="the address to serve on (0.0.0.0: "
                                                          "the room's network)"),
               port: int = typer.Option(8000, help="the hub's port"),
               brokers: int = typer.Option(1, help="the room's Kafka: 1 or 3 brokers"),
               room: str = typer.Option("", help="the board's room (LABKIT_ROOM in the "
                                                 "learners' servers; default: room)"),
               mem_limit: str = typer.Option("4G", help="memory per process of a learner's "
                                                        "server and kernels (RLIMIT_DATA); 0: none"),
               max_procs: int = typer.Option(0, help="processes and threads of the one system "
                                                     "user (room-wide, RLIMIT_NPROC); 0: none"),
               cull_idle: int = typer.Option(3600, help="stop a learner's server idle this many "
                                                        "seconds (its files stay)")) -> None:
    """Serve the lab to a room of browsers: the room's secure Kafka (a SCRAM user and ACLs
    per learner), PostgreSQL and JupyterHub; prints the address and each learner's password.
    Runs in the background: `labkit down` stops all of it."""
    from labkit.room import hub

    if brokers not in (1, 3):
        _fail(f"--brokers must be 1 or 3, not {brokers}")
    try:
        served = hub.serve(learners=learners, host=host, port=port, brokers=brokers, room=room,
                           mem_limit=hub.parse_bytes(mem_limit), max_procs=max_procs,
                           cull_idle_s=cull_idle)
    except (hub.HubError, ClusterError, LabkitSetupError) as exc:
        _fail(str(exc))
    if not served.started_here:
        typer.echo("the room's hub is already running", err=True)
    typer.echo(served.sheet())
    typer.echo("`labkit down` (make down) stops the hub, every learner's server, Kafka and "
               "PostgreSQL; learners' homes are kept.")


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="machine-readable"),
           spark: bool = typer.Option(True, "--spark/--no-spark",
                                      help="also start a SparkSession (~10 s)")) -> None:
    """Preflight for a workshop: tools, jars, memory, the cluster, a produce/consume and a
    transaction round trip, PostgreSQL, Spark. Each line ok or the command that fixes it;
    exit 1 on any failure. Never starts a broker or a database."""
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
    except (ConnectServerError, ClusterError, LabkitSetupError) as exc:
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
