"""09c · the late write: the exercise check.

The notebook runs the late write three ways (librdkafka's late commit, the Java client's
late commit, librdkafka's late Produce). The learner predicts the fourth: the Java client
(transaction version 2) whose first Produce, txn 1's record, is kept past its timeout and
delivered while txn 2 is open. What does the broker answer the late Produce, and which
records does a read_committed reader see? The check runs that experiment and compares
the prediction with the broker's answer on the wire and a read_committed read of the log.
"""
from __future__ import annotations

from labkit.exercises import Verdict, check, exercise, unanswered

IDS = ("t1", "t2")


def measured(cluster: object = None) -> dict:
    """Run the late write with the Java client and its first Produce kept: the broker's
    answer to the late Produce ("accepted" or its error), what read_committed saw, and the
    epochs involved."""
    from labkit import experiments

    run = experiments.run("late-write", client="java", hold="produce", cluster=cluster,
                          announce=lambda line: None)
    late = run.late
    return {"answer": "accepted" if late["accepted"] else late["error"],
            "visible": list(run.read_committed),
            "carried_epoch": late["carried"]["producer_epoch"],
            "partition_epoch": run.broker_then["partition_epoch"]}


def judge(answer: str, visible: list[str], run: dict) -> Verdict:
    right_answer, right_visible = answer == run["answer"], list(visible) == run["visible"]
    if right_answer and right_visible:
        return check(True, f"the late Produce carried epoch {run['carried_epoch']}, the "
                           f"partition was at epoch {run['partition_epoch']}: refused with "
                           f"{run['answer']}, and read_committed saw {run['visible']}, only "
                           "what the app committed. Under transaction version 2 every "
                           "transaction's end moved the epoch on, so nothing of txn 1 can "
                           "land in txn 2.", "")
    if not right_answer:
        if answer == "accepted":
            hint = ("the broker did something else with the late Produce. Which epoch does "
                    "t1's batch carry, and which epoch has the partition reached when it "
                    "arrives? What does the end of txn 1 do to the epoch under transaction "
                    "version 2?")
        else:
            hint = ("that is not what the broker answered. A late Produce and a late "
                    "EndTxn go to different brokers' checks (the partition's leader, the "
                    "transaction coordinator): look at which request each error above "
                    "answered.")
        return check(False, "", hint)
    return check(False, "", "my_answer matches; my_visible does not. A read_committed reader "
                            "sees records of committed transactions only: which transaction "
                            "did the app commit, and which records are in it?")


@exercise("09c_the_late_write")
def check_late_produce(answer: str | None, visible: list[str] | None,
                       cluster: object = None) -> Verdict:
    """09c: predict the broker's answer to the Java client's late Produce and what a
    read_committed reader sees; the check runs the experiment."""
    if unanswered(answer) or unanswered(visible):
        return check(False, "", "fill in my_answer and my_visible, then run this cell again.")
    if not isinstance(answer, str):
        return check(False, "", 'my_answer must be a string: "accepted", or the name of the '
                                "broker's error as the tables above print it.")
    if not isinstance(visible, (list, tuple)) or any(v not in IDS for v in visible):
        return check(False, "", f"my_visible must be a list of record ids, each one of "
                                f"{', '.join(IDS)} (an empty list if the reader sees none).")
    return judge(answer.strip(), list(visible), measured(cluster))
