"""Automatic checks for the notebooks' exercises: a friendly verdict, never a stack trace.

Each check returns a Verdict whose text is short and stable (nbval compares it). A check
that needs the cluster measures the answer against it; it never trusts the learner's claim.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    passed: bool
    message: str

    def __str__(self) -> str:
        return f"{'✅ Well done' if self.passed else '🔁 Not yet'}: {self.message}"

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython shows str(), not the dataclass
        printer.text(str(self))


def check(passed: bool, success: str, hint: str) -> Verdict:
    return Verdict(passed, success if passed else hint)


def unanswered(answer: object) -> bool:
    return answer is None or answer is ...


def check_tour(bootstrap: str, topic: str, partition: int | None, offset: int | None) -> Verdict:
    """00 · tour: predict partition and offset of the last of three more acct-03 payments.

    The check really produces the three records and compares with what the broker assigned.
    """
    if unanswered(partition) or unanswered(offset):
        return check(False, "", "fill in my_partition and my_offset, then run this cell again.")
    from confluent_kafka import Producer

    acks: list[tuple[int, int]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(3):
        producer.produce(topic, key="acct-03", value=b'{"amount": 1}',
                         on_delivery=lambda err, msg: acks.append((msg.partition(), msg.offset())))
    producer.flush(10)
    got = acks[-1]
    return check((partition, offset) == got,
                 f"the broker put it at partition {got[0]}, offset {got[1]}: same key, same "
                 "partition, and offsets count on from the high watermark.",
                 f"the broker put it at partition {got[0]}, offset {got[1]}. Same key means same "
                 "partition; the offset counts on from that partition's high watermark. "
                 "(Re-running adds three more records, so recompute first.)")
