"""A failure lab: a Kafka of an experiment's own to break (a KRaft controller and brokers 1-3).

    with failure_lab() as lab:       # stopped on every way out, failures included
        lab.kill(1); lab.frozen(2, 3); lab.restart()

    with failure_lab(network=Network()) as lab:    # labkit.faults.partition's
        lab.isolate(1); lab.heal()                  # a network partition, no root needed

Killing or freezing the brokers of a shared cluster would break everybody's lessons, so an
experiment that breaks brokers always runs on one of these, beside whatever cluster the other
lessons use (LABKIT_BOOTSTRAP does not apply here).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from labkit.kafka.localcluster import LocalCluster, private_cluster


@contextlib.contextmanager
def failure_lab(announce: Callable[[str], None] = print,
                network: Any = None) -> Iterator[LocalCluster]:
    """A private lab to break: one KRaft controller and brokers 1-3, stopped on every way out.
    ``network`` (a ``labkit.faults.partition.Network``): the brokers' links to the controller
    and to each other go through it, so ``lab.isolate(1)`` partitions broker 1; it is closed
    with the lab."""
    announce("This experiment kills brokers, so it starts a Kafka of its own on this machine "
             "(a controller and brokers 1-3), whatever cluster your other lessons use.")
    with private_cluster("failure-lab-", brokers=3, controller="dedicated",
                         network=network) as lab:
        yield lab
