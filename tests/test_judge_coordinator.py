"""The judge's coordinator phase (labkit.experiments.judge_coordinator): the reference loop,
two instances in one group, while the broker that coordinates its transactions is SIGKILLed
and restarted twice on a failure lab of three brokers, the stall supervision watching:
exact, nothing found beside the audit."""
from __future__ import annotations

from confluent_kafka import Producer

from labkit import experiments
from labkit.checking import timeline as timelines
from labkit.checking.group_progress import GroupProgress
from labkit.kafka import topics
from labkit.kafka.clientlog import client_config
from labkit.progress import wait_until


def test_the_reference_loop_outlives_its_transaction_coordinators(failure_lab):
    run = experiments.run("judge-coordinator", cluster=failure_lab, seed=1)
    # with the run's history (progress samples, stalls, starts and exits): a failure here
    # (2 of 8 fresh clones, never reproduced alone) is to be read from it
    assert run.report.exactly_once and not run.findings, \
        f"{run.summary()}\n{timelines.text(run.history)}"
    killed = [what for what in run.faults_fired if "SIGKILLed" in what]
    assert len(killed) == 2 and not run.notes, run.summary()  # both kills landed
    assert {b.running for b in failure_lab.brokers} == {True}  # the lab whole again


def test_a_broker_catching_up_after_its_restart_is_a_wait_not_a_stall(failure_lab, topic_name):
    """What the stall supervision asks before it calls a loop stuck: while a killed broker's
    replicas are out of sync, the group's partitions and the coordinators' logs may refuse
    writes (below min.insync.replicas), and while a transaction on the input is open a
    read_committed loop receives nothing past it: an app that commits nothing is waiting.
    Once the restarted broker has caught up and the transaction ended, nothing is."""
    bootstrap = failure_lab.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    topics.create(bootstrap, source, sink, partitions=3)
    with GroupProgress(bootstrap, source, sink, f"{topic_name}-group") as watch:
        wait_until(lambda: watch.recovering() is None, "every replica in sync", 60)
        failure_lab.kill(2)
        try:  # its replicas leave the ISR once the controller fences it (4 s in this lab)
            wait_until(lambda: watch.recovering() is not None, "an ISR without broker 2", 30)
            assert watch.waiting(instances_alive=0) == watch.recovering()
            assert "out of sync" in watch.recovering()
            assert watch.state()["out_of_sync"]  # what the history records at a stall
        finally:
            failure_lab.restart(2)
        wait_until(lambda: watch.recovering() is None, "broker 2 back in every ISR", 90)
        assert watch.waiting(instances_alive=0) is None  # no group, nothing to wait for
        upstream = Producer(client_config({"bootstrap.servers": bootstrap,
                                           "transactional.id": f"{topic_name}-upstream"}))
        upstream.init_transactions(30)
        upstream.begin_transaction()
        upstream.produce(source, b"open", partition=1)
        upstream.flush(10)  # written, its transaction open: the input's LSO stays below it
        assert f"{source}-1 has a transaction open" in watch.waiting(instances_alive=0)
        (stable, end), = watch.state()["input_open"].values()
        assert stable < end and list(watch.state()["input_open"]) == ["1"]
        upstream.abort_transaction(30)
        wait_until(lambda: watch.recovering() is None, "the ABORT marker written", 30)
