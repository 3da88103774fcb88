"""A stored run checked again, without Kafka (issue 50: a run is plain data; ``labkit
check PATH``).

    record = recheck(stored.load("judged.jsonl"))   # NotReplayable: which checker, and why
    print(text(record))   # the live summary's verdict and findings, computed again

The experiment's checkers are built from the stored options, as the live run built them,
and composed on the stored run (``labkit.checking.stored.StoredRun``): each read of a topic
is answered from the history's ``read`` entry (a table's from its ``table-read``), so
nothing connects anywhere. The facts that
are functions of the history alone (the judge's findings: ``Experiment.history_facts``) are
computed again too. A checker that reads anything else (Kafka or a sink through code of
its own, what the run's live parts counted) cannot be re-run from
the stored data yet: the re-check is refused, naming it, rather than giving a verdict that
was never checked.
"""
from __future__ import annotations

from types import SimpleNamespace

from labkit.checking.checks import compose
from labkit.checking.record import RunRecord
from labkit.checking.stored import NotReplayable, StoredRun
from labkit.experiments.registry import get


def recheck(run: StoredRun) -> RunRecord:
    """The stored run's checkers (and its history's facts) run again on its stored data."""
    experiment = get(run.experiment)
    if experiment.checkers is None:
        raise NotReplayable(f"{experiment.name} has no checkers to run again")
    checkers = experiment.checkers(SimpleNamespace(**run.options))
    refused = [_name(c) for c in checkers if not getattr(c, "replayable", False)]
    if refused:
        raise NotReplayable(
            f"{experiment.name} cannot be checked again offline yet: its checker "
            f"{', '.join(refused)} reads what the run's history does not hold (a Spark or "
            "Flink sink, Kafka through code of its own, the run's live parts); only checkers "
            "whose every read goes through labkit.checking.reads (a topic, a table, what was "
            "kept of a live system) are re-run")
    report, counted = compose(run, checkers)
    facts = {**run.facts, **counted, **(experiment.history_facts(run.history)
                             if experiment.history_facts is not None else {})}
    return RunRecord(experiment.name, report, topics=run.topics, history=run.history,
                     facts=facts, options=run.options, inputs=run.inputs)


def text(record: RunRecord) -> str:
    """What ``labkit check`` prints: the audit's summary (its verdict line) and the findings,
    each line as the live run's summary prints it."""
    lines = [record.report.summary()]
    lines += [f"  {name}: {', '.join(map(str, examples))}"
              for name, examples in (record.facts.get("findings") or {}).items()]
    return "\n".join(lines)


def _name(checker: object) -> str:
    """A checker as its code names it: its class, or its function."""
    named = checker if hasattr(checker, "__qualname__") else type(checker)
    return f"{named.__qualname__} ({named.__module__})"
