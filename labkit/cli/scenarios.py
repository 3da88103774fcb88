"""`labkit scenario NAME`: one command per registered experiment, built from the registry.

Nothing here is written per experiment or per engine: each command's options, defaults and
help come from its ``labkit.experiments.registry.Experiment`` (an option marked
``positional`` is the command's arguments, e.g. an app's command after ``--``), its group
(the engine: Kafka, Spark, ...) orders the list as the catalog first names it, and every
command also takes ``--json`` and ``--stall-after`` (the run's watchdog). The catalog is loaded only when a scenario command is asked for, so the rest of
``labkit`` starts fast.
"""
import inspect
import time
from typing import Any, Optional

import typer

from labkit.paths import LabkitSetupError


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


class ScenarioGroup(typer.core.TyperGroup):
    """The `scenario` command group: its subcommands are the registry's experiments."""

    def list_commands(self, ctx) -> list[str]:
        from labkit.experiments import catalog

        from labkit.experiments.registry import WHERE

        experiments = list(catalog().values())
        # engines as the catalog first names them; the lab cluster's before those with
        # brokers of their own
        groups = list(dict.fromkeys(e.group for e in experiments))
        order = lambda e: (groups.index(e.group), list(WHERE).index(e.where))  # noqa: E731
        return [e.name for e in sorted(experiments, key=order)]

    def get_command(self, ctx, name: str):
        from labkit.experiments import catalog

        experiment = catalog().get(name)
        return None if experiment is None else command(experiment)

    def resolve_command(self, ctx, args: list[str]):
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            _fail(f"unknown scenario {args[0]!r}. Valid scenarios: "
                  f"{', '.join(self.list_commands(ctx))}")
        return super().resolve_command(ctx, args)


def command(experiment, name: str | None = None):
    """The command that runs ``experiment``: a function whose signature typer reads, made
    from the experiment's options (a parameter each, default None: not given)."""
    from labkit.experiments.registry import REQUIRED, WHERE

    params = []
    for option in experiment.options:
        if not option.cli:
            continue
        if option.positional:
            params.append(inspect.Parameter(
                option.name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[list[str]],
                default=typer.Argument(None, help=option.help, show_default=False)))
            continue
        default = option.default if option.cli_default is REQUIRED else option.cli_default
        shown = "" if default in (None, REQUIRED) else f" (default {default})"
        if option.choices and " | " not in option.help:
            shown = f": {' | '.join(option.choices)}{shown}"
        if option.kind is bool:
            decls, annotation = [f"{option.flag}/--no-{option.flag[2:]}"], Optional[bool]
        else:
            decls = [option.flag, *([option.short] if option.short else [])]
            annotation = {int: Optional[int], float: Optional[float]}.get(option.kind,
                                                                          Optional[str])
        params.append(inspect.Parameter(
            option.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
            default=typer.Option(None, *decls, help=option.help + shown, show_default=False)))
    params.append(inspect.Parameter(
        "as_json", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
        default=typer.Option(False, "--json", help="print the run as one JSON object")))
    params.append(inspect.Parameter(
        "stall_after", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[float],
        default=typer.Option(None, "--stall-after", min=1, show_default=False,
                             help="no progress for this many seconds stops the run with "
                                  "an error naming its last step (default "
                                  f"{experiment.stall_after:g})")))

    def callback(as_json: bool, stall_after: float | None, **given: Any) -> None:
        run_from_terminal(experiment, as_json, stall_after, given)

    callback.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    callback.__annotations__ = {}  # typer reads the signature's annotations
    pipeline = experiment.pipeline and \
        f" The pipeline (from Python: pipeline=) is {experiment.pipeline}."
    one = typer.Typer(add_completion=False)
    about = f"\n\n{experiment.about}" if experiment.about else ""
    # an app's command after `--` keeps its own options: none of them are the lab's
    positional = {"allow_interspersed_args": False} if any(
        o.positional for o in experiment.options) else {}
    one.command(name or experiment.name, short_help=experiment.help,
                help=f"{experiment.help}. Runs {WHERE[experiment.where]}.{pipeline or ''}{about}",
                context_settings=positional)(callback)
    return typer.main.get_command(one)


def run_from_terminal(experiment, as_json: bool, stall_after: float | None,
                      given: dict[str, Any]) -> None:
    """Run it with the options given (the others at their terminal defaults), its steps on
    stderr as they happen, its audit to the room, then its text or JSON on stdout."""
    from labkit import progress
    from labkit.experiments import run
    from labkit.experiments.registry import REQUIRED
    from labkit.faults.watchdog import ExperimentStalled
    from labkit.kafka.reach import ClusterError
    from labkit.room import board

    values = {k: v for k, v in given.items() if v is not None}
    for option in experiment.options:
        if option.cli and option.cli_default is not REQUIRED and option.name not in values:
            values[option.name] = option.cli_default
    started = time.monotonic()

    def printed(what: str | None, waiting_for: str) -> None:
        if what:
            typer.echo(f"{time.monotonic() - started:5.1f} s  {what}", err=True)

    announce = lambda line: typer.echo(line, err=True)  # noqa: E731 - stdout is the result's
    try:
        with progress.listening(printed):
            result = run(experiment.name, stall_after=stall_after, announce=announce, **values)
    except (ValueError, ClusterError, LabkitSetupError, ExperimentStalled) as exc:
        _fail(str(exc))
    board.publish_audit(result.report)  # with LABKIT_ROOM set, to the room's board
    typer.echo(result.to_json() if as_json else experiment.text(result))


scenario_app = typer.Typer(
    cls=ScenarioGroup, no_args_is_help=True,
    help="Run an experiment (a pipeline, its faults and the audit) and print the audit. "
         "Those on the lab cluster start one if none runs; their topics, groups and "
         "transactional ids are in LABKIT_NAMESPACE (see `labkit status`).")
