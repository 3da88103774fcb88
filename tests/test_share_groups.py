"""Share groups (KIP-932) against the real broker: issue 12's "Done when".

One share consumer takes 40 records from one partition and acknowledges each record on its
own (ACCEPT, commit_sync), so a crash repeats at most the record it was on:

- killed after processing its 2nd record, before acknowledging it: its connection drops,
  the broker releases what it held, the record comes back and is processed twice: lost 0,
  duplicated exactly 1, every run (the 10 s lock outlasts the work on a loaded machine; with
  2 s, ACCEPTs arrived after their locks expired and more records were processed twice);
- killed right after acknowledging: lost 0, duplicated 0;
- a poison record released every time: the broker delivers it 5 times (its delivery limit),
  then archives it: archived 1, and the share coordinator's stored state says so;
- rejected: archived at its first delivery;
- at_most_once (ACCEPT, then process) killed right after the ACCEPT: that record is lost;
- frozen (SIGSTOP) after processing its 2nd record, past its group's 3 s lock, then thawed:
  the late ACCEPT is refused (INVALID_RECORD_STATE), the record comes back to the same
  consumer with delivery count 2 and is processed twice (10 records: duplicated exactly 1).

The six runs go side by side (each mostly waits: the group join, the restart, the 6 s
idle end), each with its own topics and group; each is asserted on its own. The counts come
from the output topic (what each consumer wrote per attempt) and from the broker.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from labkit import experiments
from labkit.experiments import share_group
from labkit.kafka.inspect import Inspector
from labkit.kafka.inspect.share import java_string_hash, share_state
from labkit.exercises.share import check_work_once
from labkit.pipelines import share
from tests.notebook_cells import as_cell, edited, read
from tests.solution_code import solution_code

RECORDS = 40
FROZEN_RECORDS = 10  # the thawed consumer redoes these one by one under a 3 s lock
LABKIT = Path(sys.executable).with_name("labkit")


def _cli_share(bootstrap: str, *args: str) -> dict:
    out = subprocess.run([str(LABKIT), "scenario", "share-group", "--records", str(RECORDS),
                          "--json", *args], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "LABKIT_BOOTSTRAP": bootstrap})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_crash_before_and_after_ack_and_a_poison_record(bootstrap):
    runs = {
        "before-ack": lambda: experiments.run("share-group", guarantee="at_least_once",
                                              crash_at="after-process-before-ack",
                                              records=RECORDS,
                                              cluster=bootstrap),
        "after-ack": lambda: _cli_share(bootstrap, "--guarantee", "at_least_once",
                                        "--crash-at", "after-ack"),
        "release": lambda: experiments.run("share-group", guarantee="at_least_once",
                                           records=RECORDS,
                                           cluster=bootstrap,
                                           poison="release"),
        "reject": lambda: experiments.run("share-group", guarantee="at_least_once",
                                          records=RECORDS,
                                          cluster=bootstrap,
                                          poison="reject"),
        "ack-first": lambda: experiments.run("share-group", guarantee="at_most_once",
                                             crash_at="after-ack",
                                             records=RECORDS,
                                             cluster=bootstrap),
        "frozen": lambda: experiments.run("share-group", guarantee="at_least_once",
                                          crash_at="after-process-before-ack",
                                          records=FROZEN_RECORDS,
                                          cluster=bootstrap,
                                          freeze=True),
    }
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {name: pool.submit(fn) for name, fn in runs.items()}
        done = {name: f.result() for name, f in futures.items()}

    before = done["before-ack"]
    assert before.run.crashed and before.run.exit_codes == [-9, 0]
    assert (before.report.lost, before.report.duplicated) == (0, 1)
    # the processed-twice record is the 2nd input record, delivered twice
    twice = [a for a in before.attempts if a.id == before.report.examples["duplicated"][0]]
    assert [a.outcome for a in twice] == ["processed", "processed"]
    assert [a.delivery_count for a in twice] == [1, 2]
    assert before.report.verdict == "at least once"
    # the broker holds nothing still to deliver: every record acknowledged or done
    counts = before.share_state.counts()
    assert counts["available"] == 0 and counts["not recorded"] == 0 and counts["archived"] == 0

    after = done["after-ack"]  # through the CLI: its JSON keys too
    assert (after["lost"], after["duplicated"], after["archived"]) == (0, 0, 0)
    assert after["verdict"] == "exactly once"
    assert list(after)[:15] == list(before.report.to_dict())  # the audit's keys, then the queue's
    assert {"archived", "delivery_counts", "processed_by", "out_of_order", "share_state"} <= set(after)

    release = done["release"]
    poison = [a for a in release.attempts if a.outcome != "processed"]
    assert [a.delivery_count for a in poison] == list(range(1, share.DELIVERY_LIMIT + 1))
    assert {a.outcome for a in poison} == {"released"} and len({a.id for a in poison}) == 1
    assert (release.archived, release.report.lost, release.report.duplicated) == (1, 0, 0)
    assert release.report.delivered_unique == RECORDS - 1
    # what the broker stored: the poison offset archived after 5 deliveries (or, once the
    # start offset moved past it, done with), and nothing left to deliver
    offset = 2  # the input's third record
    state = release.share_state.offsets()
    assert state.get(offset, ("archived", 5)) == ("archived", share.DELIVERY_LIMIT)
    assert release.share_state.counts()["available"] == 0

    # the picture of that state renders (images are not compared, its text form is stable)
    from labkit.widgets.share import share_picture

    picture = share_picture(release.share_state)
    assert picture.png.startswith(b"\x89PNG") and repr(picture) == "<share-partition state (static picture)>"

    reject = done["reject"]
    poison = [a for a in reject.attempts if a.outcome != "processed"]
    assert [(a.outcome, a.delivery_count) for a in poison] == [("rejected", 1)]
    assert (reject.archived, reject.report.lost, reject.report.duplicated) == (1, 0, 0)

    # at_most_once acknowledges first: killed right after the ACCEPT, that record is gone
    first = done["ack-first"]
    assert first.run.crashed
    assert (first.report.lost, first.report.duplicated, first.archived) == (1, 0, 0)
    assert first.report.examples["lost"] == [before.report.examples["duplicated"][0]]

    # frozen (SIGSTOP), not killed, after processing its 2nd record: the connection stays
    # open, so only the lock's expiry frees the record; thawed, its late ACCEPT is refused
    # and it gets the record again (delivery count 2): processed twice, by the same consumer
    frozen = done["frozen"]
    assert not frozen.run.crashed and frozen.run.exit_codes == [0]
    assert frozen.frozen_s >= share_group.FREEZE_LOCK_MS / 1000
    assert (frozen.report.lost, frozen.report.duplicated, frozen.archived) == (0, 1, 0)
    twice = [a for a in frozen.attempts if a.id == frozen.report.examples["duplicated"][0]]
    assert [(a.consumer, a.delivery_count) for a in twice] == [("0", 1), ("0", 2)]
    assert twice[0].id == before.report.examples["duplicated"][0]  # the 2nd input record
    assert [(r["offsets"], "INVALID_RECORD_STATE" in r["error"]) for r in frozen.refused_acks] \
        == [([1], True)]
    assert frozen.delivery_counts == {1: 1, 2: FROZEN_RECORDS - 1}
    counts = frozen.share_state.counts()
    assert counts["available"] == 0 and counts["not recorded"] == 0


def test_what_a_share_group_cannot_do_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="no exactly_once.*transaction"):
        experiments.run("share-group", guarantee="exactly_once", cluster="127.0.0.1:1")
    with pytest.raises(ValueError, match="not on the path of share-group.*after-process-before-ack"):
        experiments.run("share-group", guarantee="at_least_once",
                        crash_at="after-process-before-commit",
                        cluster="127.0.0.1:1")
    with pytest.raises(ValueError, match="ack_mode='explicit'"):
        experiments.run("share-group", guarantee="at_least_once", poison="release",
                        ack_mode="implicit", cluster="127.0.0.1:1")
    with pytest.raises(ValueError, match="--freeze stalls instance 0 at its --crash-at"):
        experiments.run("share-group", guarantee="at_least_once", freeze=True,
                        cluster="127.0.0.1:1")
    for limit in (1, 11, "3"):  # Kafka 4.4 refuses 1 and 11 for the group config
        with pytest.raises(ValueError, match="delivery_limit must be a whole number from 2 to 10"):
            experiments.run("share-group", poison="release", delivery_limit=limit,
                            cluster="127.0.0.1:1")
    out = subprocess.run([str(LABKIT), "scenario", "share-group", "--guarantee", "at_least_once",
                          "--freeze", "--instances", "2", "--crash-at", "after-ack"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--freeze stalls instance 0" in out.stderr
    with pytest.raises(ValueError, match="share-group takes no option fault"):
        experiments.run("share-group", guarantee="at_least_once",
                        fault="drop-ack:produce:1").report
    assert experiments.crash_points("share-group", "at_most_once") == (
        "after-acquire-before-process", "after-ack")
    assert "share-group" in experiments.catalog()
    out = subprocess.run([str(LABKIT), "scenario", "consumer", "--guarantee", "at_least_once",
                          "--poison", "reject"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "No such option: --poison" in out.stderr


def test_a_groups_own_delivery_limit_archives_the_poison_record(bootstrap):
    run = experiments.run("share-group", poison="release", delivery_limit=3, records=20,
                          cluster=bootstrap)
    assert [a.delivery_count for a in run.attempts if a.outcome != "processed"] == [1, 2, 3]
    # archived at the group's limit, not the broker's 5: no loss blamed on the queue
    assert (run.archived, run.report.lost, run.report.duplicated) == (1, 0, 0), run.summary()


def test_share_state_of_a_group_that_never_read(bootstrap, topic_name):
    from labkit.kafka import topics

    # Kafka's String.hashCode, which places a share-partition on its coordinator
    assert java_string_hash("hello") == 99162322 and java_string_hash("") == 0
    topics.create(bootstrap, topic_name)
    with Inspector(bootstrap) as inspector:
        state = share_state(inspector, "nobody-reads-this", topic_name)
    assert (state.start_offset, state.end_offset, state.batches) == (-1, 0, ())
    out = subprocess.run([str(LABKIT), "inspect", topic_name, "--share-group", "nobody", "--json"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LABKIT_BOOTSTRAP": bootstrap})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["start_offset"] == -1


def test_a_member_counts_its_idle_time_from_its_assignment(bootstrap, topic_name):
    """Under a CI load the group's first assignment came later than IDLE_S after the member
    started, and it ended as if the queue were empty before it ever got a record. Its idle
    time now starts at its assignment, which only the client's statistics report."""
    from confluent_kafka import ShareConsumer

    from labkit.kafka import topics
    from labkit.kafka.clientlog import client_config

    now = time.monotonic()
    # not assigned yet: never idle, however long the join takes, up to JOIN_LIMIT_S
    assert not share._idle(now - 2 * share.IDLE_S, None, None, share.IDLE_S)
    with pytest.raises(TimeoutError, match="not assigned a partition within 60 s"):
        share._idle(now - share.JOIN_LIMIT_S - 1, None, None, share.IDLE_S)
    # assigned: idle IDLE_S after the assignment, then after the last record
    assert share._idle(now - 60, now - share.IDLE_S - 1, None, share.IDLE_S)
    assert not share._idle(now - 60, now - 1, None, share.IDLE_S)
    assert not share._idle(now - 60, now - 50, now - 1, share.IDLE_S)

    # a real share consumer's statistics do report its assignment (cgrp.assignment_size)
    topics.create(bootstrap, topic_name)
    group = f"{topic_name}-g"
    share.prepare_group(bootstrap, group)
    queue_end = share.QueueEnd()
    consumer = ShareConsumer(client_config({"bootstrap.servers": bootstrap, "group.id": group,
                                            **queue_end.settings}))
    consumer.subscribe([topic_name])
    started = time.monotonic()
    try:
        while queue_end.assigned_at is None and time.monotonic() - started < share.JOIN_LIMIT_S:
            consumer.poll(0.5)
    finally:
        consumer.close()
    assert queue_end.assigned_at is not None
    assert queue_end.assigned_at - started < share.JOIN_LIMIT_S
    assert not queue_end.reached()  # assigned, nothing polled since: idle only after IDLE_S


# ---------------------------------------------------------------- 11's exercise: the work once
def _notebook_function(name: str):
    source = next(c.source for c in read("11_share_groups").cells
                  if c.cell_type == "code" and f"def {name}(" in c.source)
    return source, as_cell(source, name)


def test_the_documented_work_once_passes_and_a_set_only_read_at_start_does_not(bootstrap):
    """The solution reads the ids already worked on at start and adds each one after its
    work: exact killed and frozen. Without the second half, the frozen consumer (the same
    process, never restarted) works on its order twice, and the hint says so without the
    code."""
    _, shown = _notebook_function("take_orders")
    solution = solution_code("11_share_groups")
    verdict = check_work_once(as_cell(solution, "take_orders_once"), shown, bootstrap)
    assert verdict.passed, verdict.message
    only_at_start = edited(solution, "                    done.add(order_id)\n", "")
    verdict = check_work_once(as_cell(only_at_start, "take_orders_once"), shown, bootstrap)
    assert not verdict.passed and "frozen past its lock" in verdict.message
    assert "done_orders" not in verdict.message and "done.add" not in verdict.message


def test_the_work_once_check_refuses_the_unchanged_loop_without_running():
    source, shown = _notebook_function("take_orders")
    unchanged = as_cell(source.replace("def take_orders(", "def take_orders_once("),
                        "take_orders_once")
    verdict = check_work_once(unchanged, shown, "127.0.0.1:1")
    assert not verdict.passed and "still the loop of section 2" in verdict.message
    assert "your function itself" in check_work_once(None, shown, "127.0.0.1:1").message
    no_point = as_cell(source.replace('crash_point("after-process-before-ack")', "pass")
                       .replace("def take_orders(", "def take_orders_once("), "take_orders_once")
    verdict = check_work_once(no_point, shown, "127.0.0.1:1")
    assert not verdict.passed and "after-process-before-ack" in verdict.message
