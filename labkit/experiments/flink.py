"""The Flink experiments: a PyFlink job (the learner's, or the lab's ``fee_job``) reading
payments ``read_committed``, adding the card fee and writing them through Flink's
two-phase-commit Kafka sink, SIGKILLed from outside at a named moment of a checkpoint,
restored from its latest retained checkpoint, and its output audited read_committed.

    run = experiments.run("flink-crash", guarantee="exactly_once", kill_at="mid-checkpoint",
                          pipeline=my_job)        # the learner's job, a function of a cell
    run = experiments.run("flink-latency", checkpoint_interval_ms=500)
    run = experiments.run("flink-timeout-trap", transaction_timeout_ms=5000, down_s=6)
    run = experiments.run("flink-refused-start", transaction_timeout_ms=3_600_000)
    run.report, run.kills, run.starts, run.latency, run.transactions, run.flink_said

The composition: payments for a producer to write at ``rate`` a second while the job runs
(the workload), the job started and restored until its input is consumed
(``labkit.flink.clients.FlinkJob``: the job's process group, Python and JVM, is the run's
workers), the aimed SIGKILLs (``labkit.flink.aim.AimedKill``, each fired by the event
``checkpointed`` of one start and keeping the job down ``down_s`` seconds), the audit of the
output read_committed (``labkit.flink.report.OutputAudit``). The run's topics, its
checkpoints and the jobs' logs (the run's folder) are the run context's, deleted with it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from labkit.checking import reads
from labkit.checking.audit import audit_read
from labkit.checking.checks import Counted
from labkit.checking.record import Presentation
from labkit.experiments import options as common
from labkit.experiments.parts import Topic, Workload
from labkit.experiments.registry import REQUIRED, Experiment, Option, register
from labkit.faults.nemesis import Nemesis, on
from labkit.flink import report
from labkit.flink.aim import KILL_POINTS, AimedKill, missed
from labkit.flink.clients import GUARANTEES, FlinkJob, RefusedStart
from labkit.flink.runsetup import START_S, check_job
from labkit.flink.timeouts import LEGACY_FLINK_TIMEOUT_MS, broker_max_timeout_ms
from labkit.pipelines import data, learner

GROUP = "Flink"
STALL_S = 2 * START_S + 60  # a start on a loaded machine (up to START_S), then its steps
REFUSED_INPUT = 20  # payments waiting for a job that never starts
# Flink's sink stamps each output record with its input record's timestamp: the output's
# batches carry the time the broker appended them instead, so a record written without a
# transaction (AT_LEAST_ONCE) shows when it became visible (labkit.flink.visibility).
APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


def points(value: Any) -> list[str]:
    """Kill points from a list or the command line's ``a,b``; "" (or none): no kill."""
    given = value.split(",") if isinstance(value, str) else list(value or ())
    found = [p.strip() for p in given if p.strip()]
    for point in found:
        if point not in KILL_POINTS:
            raise ValueError(f"unknown kill point {point!r}: choose from {', '.join(KILL_POINTS)}")
    return found


def downs(value: Any, kills: int) -> list[float]:
    """Seconds down after each kill from one number, a list, or the command line's ``0,6``."""
    given = value.split(",") if isinstance(value, str) else (
        list(value) if isinstance(value, (list, tuple)) else [value])
    try:
        found = [float(d) for d in given]
    except (TypeError, ValueError):
        raise ValueError(f"down_s must be seconds (one number, or one per kill), not "
                         f"{value!r}") from None
    if any(d < 0 for d in found):
        raise ValueError(f"down_s must be 0 or more, not {value}")
    if len(found) == 1:
        return found * kills
    if len(found) != kills:
        raise ValueError(f"down_s must be one number, or one per kill ({kills}), not {value}")
    return found


def _check_kills(kill_at: Any, down_s: Any, **_: Any) -> None:
    downs(down_s, len(points(kill_at)))


def check_pipeline(pipeline: Callable, o: Any) -> None:
    """The learner's job, before anything starts: a function of a cell that parses and asks
    only for what the lab provides (its PyFlink imports inside it: the kernel has none)."""
    check_job(learner.code_of(pipeline), pipeline.__name__)


def _missed(run: Any) -> str | None:
    """Why a kill missed its window (its commit on the way, or its checkpoint completed
    first: ``labkit.flink.aim.missed``): the run is made again, once."""
    return next(filter(None, map(missed, report.kills(run))), None)


def _job(run: Any) -> FlinkJob:
    o = run.o
    return FlinkJob(o.guarantee, interval_ms=o.checkpoint_interval_ms,
                    timeout_ms=o.transaction_timeout_ms, rate=o.rate, stream_s=o.stream_s,
                    steady_checkpoints=getattr(o, "steady_checkpoints", 0), **_code(run))


def _code(run: Any) -> dict:
    if run.pipeline is None:
        return {}
    return {"function": run.pipeline.__name__, "job_code": learner.code_of(run.pipeline)}


def _kills(o: Any) -> Nemesis:
    """The kill points in order, the i-th fired by the i-th start's first checkpoint."""
    kills = points(getattr(o, "kill_at", ""))
    return Nemesis(*(AimedKill(point, on("checkpointed", start=i + 1), down, seed=o.seed)
                     for i, (point, down) in enumerate(zip(kills, downs(o.down_s, len(kills))))))


def _payments(o: Any) -> Workload:
    # more than the run can write: the producer stops stream_s after the last kill
    kills = points(getattr(o, "kill_at", ""))
    seconds = (START_S * (2 + len(kills)) + o.stream_s + sum(downs(o.down_s, len(kills))))
    return Workload("flink", (Topic("input"), Topic("output", config=APPEND_TIME)),
                    data.generate(int(o.rate * seconds), seed=o.seed))


GUARANTEE = Option("guarantee", REQUIRED, " | ".join(GUARANTEES) + ": the sink's delivery "
                   "guarantee", GUARANTEES, short="-g")
INTERVAL = Option("checkpoint_interval_ms", 1000, "a checkpoint every this many ms", kind=int,
                  minimum=100, maximum=60_000)
RATE = Option("rate", 100.0, "payments a second", kind=float, minimum=1, maximum=5000)
SEED = common.seed("the payments and a random kill's moment")
KEEP = common.keep_topics(True)


def _timeout(default: int) -> Option:
    return Option("transaction_timeout_ms", default, "the sink's transaction.timeout.ms",
                  kind=int, minimum=1000, why="the broker refuses less than 1 s")


def _stream(default: float) -> Option:
    return Option("stream_s", default, "seconds of payments after the last kill", kind=float,
                  minimum=0)


def _down(default: str) -> Option:
    return Option("down_s", default, "seconds the job stays down after each kill (one "
                  "number, or one per kill: 0,6)")


def _flink(name: str, help: str, options: tuple[Option, ...], about: str = "",
           check: Callable[..., None] | None = _check_kills) -> Experiment:
    return register(Experiment(
        name, help, group=GROUP, stall_after=STALL_S, options=options, about=about, check=check,
        pipeline="the job function (a PyFlink job: its imports inside it, the parameters it "
                 "names from labkit.flink.runsetup.JOB_PROVIDES)",
        check_pipeline=check_pipeline, text=lambda run: f"{run.summary()}\n{run.timeline()}",
        workload=_payments, clients=_job, nemesis=_kills, missed=_missed, attempts=2,
        checkers=lambda o: [report.OutputAudit(o.guarantee)], facts=report.facts,
        presentation=Presentation(summary=report.summary, json=report.to_dict)))


_flink("flink-crash", "Flink's two-phase-commit Kafka sink: the job SIGKILLed at a checkpoint's "
       "pre-commit, before its commit or at random, restored from its latest checkpoint",
       (GUARANTEE, Option("kill_at", "mid-checkpoint", "where each SIGKILL lands, in order: "
                          f"{' | '.join(KILL_POINTS)}, comma-separated (one kill each)"),
        _down("0"), INTERVAL, _timeout(60_000), RATE, _stream(2.0),
        Option("steady_checkpoints", 0, "checkpoints completed with payments before the first "
               "kill is aimed (the latency before it: a job undisturbed)", kind=int,
               minimum=0), SEED, KEEP),
       about="mid-checkpoint: checkpoint N triggered and pre-committed, not complete (the "
             "restore goes back to N-1); before-commit: N complete, its transaction still "
             "open at the broker (the restored job commits it); random: within one interval "
             "of the last checkpoint.")

_flink("flink-latency", "Flink's two-phase-commit Kafka sink, undisturbed: how long a payment "
       "takes to become visible to a read_committed reader, per checkpoint interval",
       (Option("guarantee", "exactly_once", " | ".join(GUARANTEES), GUARANTEES, short="-g"),
        INTERVAL, RATE, _stream(5.0), SEED, KEEP,
        Option("transaction_timeout_ms", 60_000, "the sink's transaction.timeout.ms", kind=int,
               cli=False), Option("down_s", 0, "no kill: no downtime", cli=False)),
       check=None)

_flink("flink-timeout-trap", "Flink's sink killed after a checkpoint completed, before its "
       "commit, and kept down: past transaction.timeout.ms the broker aborts what the "
       "restore would commit",
       (Option("guarantee", "exactly_once", " | ".join(GUARANTEES), GUARANTEES, short="-g"),
        _timeout(5000), _down("6"), INTERVAL, RATE, _stream(2.0), SEED, KEEP,
        Option("kill_at", "before-commit", "the kill point", cli=False)),
       about="Down longer than transaction.timeout.ms (plus the broker's abort check, 1 s "
             "in the lab), the pre-committed transaction is aborted by the broker and its "
             "records are lost; a timeout longer than the downtime and the restore keeps "
             "them.")


@dataclass(frozen=True)
class RefusalAudit:
    """The output of a job that never started, against its input (every payment lost),
    the fault named with the broker's transaction.max.timeout.ms: asked once the run is
    over and kept in the history (``reads.kept``), as the output's read is."""

    transaction_timeout_ms: int

    # both reads are the history's: a stored run re-checks it
    replayable: ClassVar[bool] = True

    def __call__(self, run: Any) -> Counted:
        broker_max_ms = reads.kept(run, "broker-max-timeout",
                                   lambda: broker_max_timeout_ms(run.bootstrap))
        fault = (f"transaction.timeout.ms={self.transaction_timeout_ms} above the broker's "
                 f"transaction.max.timeout.ms={broker_max_ms}")
        return Counted(audit_read(reads.topic(run, "output"), run.inputs, run.experiment,
                                  "exactly_once", fault=fault), {"broker_max_ms": broker_max_ms})


def _refused_facts(run: Any) -> dict:
    return {"transaction_timeout_ms": run.o.transaction_timeout_ms, "run_id": run.run_id}


def _refused(run: Any) -> RefusedStart:
    return RefusedStart(run.o.transaction_timeout_ms, **_code(run))


register(Experiment(
    "flink-refused-start", "Flink's sink with a transaction.timeout.ms above the broker's "
    "transaction.max.timeout.ms: the job fails as it starts, in the broker's words",
    group=GROUP, stall_after=STALL_S, check_pipeline=check_pipeline,
    pipeline="the job function (as for flink-crash)",
    options=(Option("transaction_timeout_ms", LEGACY_FLINK_TIMEOUT_MS, "the sink's "
                    "transaction.timeout.ms (default: the legacy FlinkKafkaProducer's hour)",
                    kind=int, minimum=1000, why="the broker refuses less than 1 s"), KEEP),
    workload=lambda o: Workload("flink-refused", (Topic("input", loaded=True), Topic("output")),
                                data.generate(REFUSED_INPUT)),
    clients=_refused, checkers=lambda o: [RefusalAudit(o.transaction_timeout_ms)],
    facts=_refused_facts,
    text=lambda run: run.summary(),
    presentation=Presentation(summary=report.refusal_summary, json=report.refusal_to_dict)))
