"""What the judge finds beside the audit's counts: what production would see of a loop's
reactions, each a finding named like the audit's anomalies.

- ``hanging-transaction``: a transaction still open once the input was consumed and the
  output quiet (an instance died and nothing fenced what it left open): every read_committed
  reader of its partitions waits for it until its ``transaction.timeout.ms``.
- ``fenced-ran-on``: an instance went on after it was fenced (a fatal error taken for one to
  recover from): it initialised its transactional.id again without a restart (so fenced its
  successor in turn), or it was told it was fenced and was still running at the end.
- ``abortable-raised``: an instance ended on an abortable error instead of aborting the
  transaction and reading its batch again.
- ``offsets-behind``: the group's committed offsets stopped short of what it processed,
  also after a restart: a restart from them would read records again (a read_committed
  consumer from each committed offset receives one; an offset before a marker or an
  upstream's aborted records only is not behind).
- ``stopped-short``: input records the loop never processed when it was judged (it stalled,
  also after a restart), and that its group reads again: waiting, not lost, so never counted
  lost by the audit (``checks.TopicAudit(restart_reads=True)``).
- ``aborted-input-read``: records of the input's aborted transactions (an upstream's) in
  the output: the loop read its input read_uncommitted. Data, so the audit's verdict too.

Every finding is a function of the run's history alone (``labkit.checking.history``): the
transactions as the proxy saw them on the wire (``wire``: the transactional APIs), the
processes as the supervisor and the workers recorded them (when each started, with which
transactional.id; what each raised), the faults (``fault``: which instance a successor
fenced), the group's offsets as last sampled (``progress``), the transactions left open at
the end (``open-transactions``), where the feed wrote each input (``written``) and what the
checkers read once the run was over (``read``, ``offsets-read``). None needs the loop's
cooperation: a loop the lab did not write is judged the same way, and a stored history can
be judged again.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from labkit.checking import history, reads
from labkit.checking.checkers import Result
from labkit.experiments.feed import ABORTED_PREFIX

# The APIs a transactional loop speaks to its coordinators, and Produce: what the ledger
# traces. A producer fenced in the middle of a transaction may first hear it on a Produce
# (INVALID_PRODUCER_EPOCH); after that fatal error its client sends no EndTxn to hear it on.
LEDGER_APIS = {"InitProducerId", "AddPartitionsToTxn", "AddOffsetsToTxn", "TxnOffsetCommit",
               "EndTxn", "Produce"}
FENCING = {"PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "TRANSACTIONAL_ID_NOT_FOUND"}


class Ledger:
    """The transactional exchanges a run's clients had through the proxy, in order (the
    history's ``wire`` entries)."""

    def __init__(self, exchanges: list[dict]) -> None:
        self.exchanges = exchanges

    @classmethod
    def of(cls, events: list[dict]) -> "Ledger":
        return cls([e for e in events if e["kind"] == "wire"])

    def fresh_inits(self, transactional_id: str) -> list[float]:
        """When ``transactional_id`` was initialised anew (InitProducerId without a producer
        id, answered without error: a producer's init_transactions(), not an epoch bump)."""
        return [e["t"] for e in self.exchanges
                if e["api"] == "InitProducerId" and e.get("transactional_id") == transactional_id
                and e.get("request_producer_id", -1) == -1 and e.get("error") is None]

    def fenced_at(self, transactional_id: str, since: float = 0.0) -> list[float]:
        """When a request of ``transactional_id`` was answered that its producer is fenced."""
        return [e["t"] for e in self.exchanges if e.get("transactional_id") == transactional_id
                and e.get("error") in FENCING and e["t"] >= since]


def events(run) -> list[dict]:
    """The run's history so far (its file: the record's copy is made when the run closes)."""
    return history.read(run.history_file)


def raised(events: list[dict]) -> list[dict]:
    """What each instance that exited with an error raised (the runner's record of it)."""
    return [e for e in events if e["kind"] == "raised"]


KAFKA_ERROR = re.compile(r"KafkaError\{code=(\w+),val=-?\d+,str=\"([^\"]*)\"(.*?)\}")


def raised_in(log: str) -> str:
    """What a process raised, from its log's last lines: Kafka's error and its class (a
    process the lab did not start as a worker has no history record of it)."""
    found = KAFKA_ERROR.findall(log)
    if found:
        code, text, flags = found[-1]
        kind = ("fatal" if "fatal=True" in flags else "abortable" if
                "txn_requires_abort=True" in flags else "retriable" if "retriable=True" in flags
                else "not retriable")
        return f"{code} ({kind}): {text}"
    lines = [line.strip(" |") for line in log.splitlines() if line.strip(" |")]
    return lines[-1] if lines else "(nothing in its log)"


def given(events: list[dict]) -> dict[str, str]:
    """Each instance's transactional.id, as its starts recorded it."""
    return {e["instance"]: e["transactional_id"] for e in events
            if e["kind"] == "started" and e.get("transactional_id")}


def starts(events: list[dict], transactional_id: str) -> list[float]:
    """When a process with ``transactional_id`` in its settings started."""
    return [e["t"] for e in events if e["kind"] == "started"
            and e.get("transactional_id") == transactional_id]


def ran_on(events: list[dict]) -> list[str]:
    """Instances that went on after they were fenced."""
    found = []
    successors = {str(e["successor"]): e for e in events
                  if e["kind"] == "fault" and e.get("fault") == "Replace"}
    for e in raised(events):  # a successor fenced in its turn: the old one came back
        if str(e.get("instance")) in successors and e.get("fatal"):
            found.append(f"instance {e['instance']} (a successor) fenced in its turn: "
                         f"{e.get('code')}")
    ledger, ids = Ledger.of(events), given(events)
    for transactional_id in sorted(set(ids.values())):
        inits, started = (ledger.fresh_inits(transactional_id),
                          starts(events, transactional_id))
        if len(inits) > len(started):
            found.append(f"{transactional_id} initialised {len(inits)} times by "
                         f"{len(started)} process start(s): a fenced producer made anew")
    finished = [e for e in events if e["kind"] == "finished"]
    alive_at_done = {str(i) for i in (finished[-1]["running"] if finished else [])}
    stall_killed = {str(i) for e in events if e["kind"] == "stalled"
                    for i in e.get("running", [])}
    for successor, fault in successors.items():
        fenced = str(fault["fenced"])
        old = ids.get(fenced)
        since = min((e["t"] for e in events if e["kind"] == "started"
                     and e["instance"] == successor), default=0.0)
        went_on = fenced in alive_at_done or fenced in stall_killed
        if old and went_on and ledger.fenced_at(old, since):
            found.append(f"instance {fenced} was told it was fenced and went on running")
    return found


def restart_split(events: list[dict]) -> tuple[list[str], list[str]] | None:
    """Once the run was over, the input records a restart of the group reads again (where the
    feed wrote them, at or past the group's committed offsets as the checker read them: an
    upstream's aborted records are never among them), split in two: those in the output
    (processed, their offsets not committed: a restart repeats them) and those not (never
    processed). None: the history holds no such reads (a run without the lab's feed)."""
    at = reads.written_at(events)
    offsets = [e for e in events if e["kind"] == reads.OFFSETS and e.get("role") == "input"]
    output = [e for e in events if e["kind"] == reads.READ and e.get("role") == "output"]
    if not (at and offsets and output):
        return None
    committed = {int(p): o for p, o in offsets[-1]["offsets"].items()}
    out = {str(value.get("id")) for _, _, _, value, readers in output[-1]["records"]
           if "c" in readers and isinstance(value, dict)}
    again = reads.read_again(at, committed)
    return [i for i in again if i in out], [i for i in again if i not in out]


def stopped_short(events: list[dict]) -> list[str]:
    """Input records the loop never processed by the time it was judged (it stalled, and a
    restart did not move it on): not lost, since its group reads them again."""
    split = restart_split(events)
    if not split or not split[1]:
        return []
    never = split[1]
    return [f"{len(never)} input record(s) never processed, e.g. {', '.join(never[:3])}: "
            "a restart of the group reads them (not lost)"]


def behind(events: list[dict]) -> list[str]:
    """What a restart from the group's committed offsets would read again that the loop had
    already processed (as a read_committed consumer receives it: never a marker or an
    upstream's aborted record): from the checker's reads once the run was over, or else by
    the group's offsets as last sampled."""
    split = restart_split(events)
    if split is not None:
        repeated = split[0]
        return [f"a restart from the committed offsets reads {len(repeated)} processed "
                f"record(s) again, e.g. {', '.join(repeated[:3])}"] if repeated else []
    read = [e for e in events if e["kind"] == "progress"]
    if not read:
        return []
    committed, end = read[-1]["committed"], read[-1]["end"]
    if committed >= end:
        return []
    again = {int(p): n for p, n in (read[-1].get("unread") or {}).items() if n}
    if not again:
        return [f"{committed} of {end} input offsets committed"]
    return [f"a restart from the committed offsets reads {sum(again.values())} record(s) again "
            f"(partition(s) {', '.join(map(str, sorted(again)))})"]


def hanging(events: list[dict]) -> list[str]:
    """The transactions found open once the run was done that no instance ended."""
    return sorted({t for e in events if e["kind"] == "open-transactions"
                   for t in e.get("hanging", [])})


def behaviour(events: list[dict]) -> list[Result]:
    """The findings that hold (each a Result with its examples), in a fixed order: a
    function of the run's history alone."""
    abortable = [f"instance {e['instance']}: {e.get('code')} {e.get('text', '')[:160]}"
                 for e in raised(events) if e.get("abortable") and not e.get("fatal")]
    found = [("hanging-transaction", hanging(events)), ("fenced-ran-on", ran_on(events)),
             ("abortable-raised", abortable), ("offsets-behind", behind(events)),
             ("stopped-short", stopped_short(events))]
    return [Result(name, False, len(examples), examples) for name, examples in found if examples]


@dataclass(frozen=True)
class AbortedInputRead:
    """A checker: the output's records that came from the input's aborted transactions, as a
    downstream consumer reading with ``isolation`` got them."""

    isolation: str
    replayable: ClassVar[bool] = True  # it reads Kafka through labkit.checking.reads only

    def __call__(self, run) -> list[Result]:
        seen = [r.value.get("id") for r in reads.topic(run, "output").seen_by(self.isolation)]
        read = sorted({i for i in seen if str(i).startswith(f"{ABORTED_PREFIX}-")})
        return [Result("aborted-input-read", not read, len(read), read[:5])]


def aborted_input_read(isolation: str) -> AbortedInputRead:
    return AbortedInputRead(isolation)


def history_facts(events: list[dict]) -> dict:
    """The judge's facts that are functions of its history alone: what ``labkit check``
    computes again on a stored run."""
    return {"findings": {r.name: r.examples for r in behaviour(events)}}
