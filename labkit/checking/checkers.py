"""The audit's checkers, one small function per finding, and the one verdict they add up to.

Each checker takes plain data (ids, keys, counts) and returns a ``Result``; ``verdict``
composes results into the delivery guarantee the run actually showed. Names follow Jepsen's
Kafka workload (jepsen.tests.kafka) so a learner can look them up:

- ``lost-write``: an input record never observed downstream. Jepsen also has ``unseen``
  (written but not yet read when the history ends); it is folded in here, because the lab
  audits only after the pipeline ran to the end of its input: a record not observed by then
  never will be.
- ``duplicate``: every extra copy of an observed record.
- ``aborted-read``: an observed record that belongs to an aborted transaction.
- ``non-monotonic``: per key, a record observed (for the first time) after a record of the
  same key that came later in the input. Judged only from the order the sink itself shows
  (topic offsets, a database-generated sequence), never from pipeline bookkeeping.
- ``state-drift``: the final state (e.g. a count per key) differs from the input's.

Jepsen's ``poll-skip`` and non-monotonic *offsets* need a history of each consumer's polls
and sends, which the lab does not record yet: ``history_checks`` is the hook for them.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

EXAMPLES = 5  # examples kept per finding: enough to explain, short enough to print

LOST_WRITE, DUPLICATE, ABORTED_READ = "lost-write", "duplicate", "aborted-read"
NON_MONOTONIC, STATE_DRIFT = "non-monotonic", "state-drift"

EXACTLY_ONCE, AT_LEAST_ONCE, AT_MOST_ONCE, INCORRECT = (
    "exactly once", "at least once", "at most once", "incorrect")


@dataclass(frozen=True)
class Delivered:
    """One record as observed downstream, in the order the sink shows it."""

    id: str
    key: str | None
    offset: int | None = None  # topic offset (None for a table row)
    partition: int | None = None


@dataclass(frozen=True)
class Result:
    """One checker's finding: ``count`` anomalies, a few ``examples`` (ids or keys)."""

    name: str
    valid: bool
    count: int
    examples: list = field(default_factory=list)


def _result(name: str, count: int, examples: Iterable) -> Result:
    return Result(name, count == 0, count, list(examples)[:EXAMPLES])


def lost_write(input_ids: Sequence[str], delivered_ids: Iterable[str]) -> Result:
    """Input ids never delivered (in input order)."""
    seen = set(delivered_ids)
    lost = [i for i in input_ids if i not in seen]
    return _result(LOST_WRITE, len(lost), lost)


def duplicate(input_ids: Sequence[str], delivered_ids: Iterable[str]) -> Result:
    """Every extra copy of a delivered id; examples in input order (ids not in it first)."""
    copies = Counter(delivered_ids)
    position = {i: n for n, i in enumerate(input_ids)}
    dups = sorted((i for i, n in copies.items() if n > 1), key=lambda i: position.get(i, -1))
    return _result(DUPLICATE, sum(n - 1 for n in copies.values() if n > 1), dups)


def aborted_read(aborted_ids: Sequence[str]) -> Result:
    """Records the reader saw although their transaction was aborted."""
    return _result(ABORTED_READ, len(aborted_ids), aborted_ids)


def non_monotonic(input_ids: Sequence[str], delivered: Sequence[Delivered]) -> Result:
    """Per key, first deliveries that come after a later input of the same key.

    Only first copies count: a replayed batch is a duplicate, not a reorder.
    """
    position = {i: n for n, i in enumerate(input_ids)}
    latest: dict[str | None, int] = {}
    first_seen: set[str] = set()
    reordered = []
    for d in delivered:
        if d.id in first_seen or d.id not in position:
            continue
        first_seen.add(d.id)
        if position[d.id] < latest.get(d.key, -1):
            reordered.append(d.id)
        latest[d.key] = max(position[d.id], latest.get(d.key, -1))
    return _result(NON_MONOTONIC, len(reordered), reordered)


def drifted_keys(expected, actual) -> list:
    """Keys whose state differs ("(total)" when the state is one number)."""
    if not isinstance(expected, dict) or not isinstance(actual, dict):
        return [] if expected == actual else ["(total)"]
    return sorted(k for k in set(expected) | set(actual) if expected.get(k) != actual.get(k))


def state_drift(expected: Mapping | int | None, actual: Mapping | int | None) -> Result:
    """The final state against the state the input implies; examples are the drifted keys."""
    keys = drifted_keys(expected, actual)
    return _result(STATE_DRIFT, len(keys), keys)


def count_shortfall(expected: Mapping[str, int], actual: Mapping[str, int]) -> Result:
    """A count sink keeps no ids: a total below the input's count per key is lost writes."""
    short = {k: n - actual.get(k, 0) for k, n in expected.items() if actual.get(k, 0) < n}
    return _result(LOST_WRITE, sum(short.values()), (f"{k}: -{d}" for k, d in sorted(short.items())))


def count_excess(expected: Mapping[str, int], actual: Mapping[str, int]) -> Result:
    """A count sink's total above the input's count per key: records counted twice."""
    extra = {k: n - expected.get(k, 0) for k, n in actual.items() if n > expected.get(k, 0)}
    return _result(DUPLICATE, sum(extra.values()), (f"{k}: +{d}" for k, d in sorted(extra.items())))


def history_checks(history: Sequence[dict] | None) -> list[Result]:
    """HOOK for Jepsen's ``poll-skip`` and ``non-monotonic-poll``/``-send`` (offsets going
    backwards or jumping within one consumer's polls). They need a per-consumer history of
    (poll|send, partition, offset) operations, which the pipelines do not record yet; until
    they do, there is nothing to check and no result joins the verdict."""
    if history:
        raise NotImplementedError("history checkers (poll-skip, non-monotonic offsets) are not "
                                  "built yet: the pipelines record no history")
    return []


def anomalies(results: Iterable[Result]) -> list[str]:
    """Names of the checkers that found something, in the order given."""
    return [r.name for r in results if not r.valid]


def verdict(results: Iterable[Result]) -> str:
    """The one rule that turns findings into a guarantee, used by every audit in the lab.

    - exactly once: no checker found anything.
    - at least once: duplicates, nothing lost. at most once: losses, no duplicates.
    - incorrect: losses *and* duplicates; any aborted read (the reader saw data that was
      never committed), non-monotonic order, or any other checker's finding (neither
      guarantee allows them); or state
      drift with neither losses nor duplicates to explain it (the records look right but
      the state does not, e.g. a state store that counted a batch twice).
    State drift next to losses or duplicates is their consequence and adds nothing.
    """
    bad = set(anomalies(results))
    lost, dup = LOST_WRITE in bad, DUPLICATE in bad
    # any other checker's finding (a zombie's write let through, ...) breaks every guarantee
    if (lost and dup) or bad - {LOST_WRITE, DUPLICATE, STATE_DRIFT}:
        return INCORRECT
    if STATE_DRIFT in bad and not (lost or dup):
        return INCORRECT
    return AT_LEAST_ONCE if dup else AT_MOST_ONCE if lost else EXACTLY_ONCE


# --------------------------------------------------------------------------- share groups
# A queue (KIP-932 share group) has no order to keep across consumers and may legitimately
# give up on a record: the broker archives it (REJECT, or the delivery limit reached). The
# checkers below judge a share group's processing log: one ``Attempt`` per time a consumer
# had a record, in the order the log shows them.

ARCHIVED = "archived"


@dataclass(frozen=True)
class Attempt:
    """One time a consumer had a record: what it did, and the broker's delivery count."""

    id: str
    consumer: str
    delivery_count: int | None
    outcome: str  # processed | released | rejected


def archived_ids(input_ids: Sequence[str], attempts: Sequence[Attempt], limit: int) -> list[str]:
    """Input ids (in input order) never processed that the broker archived: rejected, or
    released on their ``limit``-th delivery."""
    done = {a.id for a in attempts if a.outcome == "processed"}
    gone = {a.id for a in attempts if a.id not in done and (
        a.outcome == "rejected" or (a.outcome == "released" and (a.delivery_count or 0) >= limit))}
    return [i for i in input_ids if i in gone]


def archived(input_ids: Sequence[str], attempts: Sequence[Attempt], limit: int) -> Result:
    """Records the broker archived (see ``archived_ids``). Not an error of the queue (it is
    how a poison record ends), so the verdict ignores it, and lost-write leaves them out."""
    ids = archived_ids(input_ids, attempts, limit)
    return _result(ARCHIVED, len(ids), ids)


def delivery_counts(attempts: Sequence[Attempt]) -> dict[int, int]:
    """How many records reached each highest delivery count (1: delivered once)."""
    highest: dict[str, int] = {}
    for a in attempts:
        highest[a.id] = max(highest.get(a.id, 0), a.delivery_count or 0)
    return dict(sorted(Counter(highest.values()).items()))


def order_per_consumer(input_ids: Sequence[str], attempts: Sequence[Attempt]) -> dict[str, Result]:
    """Per consumer, its processed records that came after a later input record it had
    already processed: a queue keeps no order across consumers, and a redelivered record
    comes back after its successors even within one."""
    by_consumer: dict[str, list[Delivered]] = {}
    for a in attempts:
        if a.outcome == "processed":
            by_consumer.setdefault(a.consumer, []).append(Delivered(a.id, None))
    return {c: non_monotonic(input_ids, seen) for c, seen in sorted(by_consumer.items())}


# --------------------------------------------------------------------------- one processing
# Exactly once means the output equals *one* processing of each record. A transform that is
# not deterministic across attempts (a lookup in a table that changed, a clock) computes a
# replayed batch differently; a sink that keeps the first attempt's output (a transaction,
# Delta's txnVersion) or the second's still shows one processing, an upsert that the second
# attempt only partly overwrites shows both mixed.

MIXED_ATTEMPTS = "mixed-attempts"
_NOTHING = object()  # a processing that gives no output for a record (e.g. filtered out)


def single_processing(inputs: Sequence[tuple[str, str]], observed: Iterable[tuple[str, object]],
                      processings: Sequence[Mapping[str, object]]) -> Result:
    """Keys whose output matches no single processing of each of their records.

    ``inputs``: (id, key) in input order. ``observed``: (id, value) for every output row (an
    id absent: no output for it). ``processings``: what each possible processing gives, id ->
    value (an id absent: that processing writes nothing for it), in the order they can
    happen (the lookup changed once, from the first to the second).

    A key matches when its records, in input order, can each be given one processing, never
    going back to an earlier one (records processed before the change, then after it), such
    that each record's output is exactly that processing's. Two copies of a record with
    different values never match. Examples: the mixed keys.
    """
    seen: dict[str, set] = {}
    for i, value in observed:
        seen.setdefault(i, set()).add(value)
    by_key: dict[str, list[str]] = {}
    for i, key in inputs:
        by_key.setdefault(key, []).append(i)
    mixed = []
    for key, ids in by_key.items():
        current = 0
        for i in ids:
            got = seen.get(i, {_NOTHING})
            fits = [n for n in range(current, len(processings))
                    if len(got) == 1 and next(iter(got)) == processings[n].get(i, _NOTHING)]
            if not fits:
                mixed.append(key)
                break
            current = fits[0]  # the earliest that fits leaves the most room for the rest
    return _result(MIXED_ATTEMPTS, len(mixed), mixed)
