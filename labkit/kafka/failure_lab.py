"""A failure lab: a Kafka of an experiment's own to break (a KRaft controller and brokers 1-3).

    with failure_lab() as lab:       # stopped on every way out, failures included
        lab.kill(1); lab.frozen(2, 3); lab.restart()

Killing or freezing the brokers of a shared cluster would break everybody's lessons, so an
experiment that breaks brokers always runs on one of these, beside whatever cluster the other
lessons use (LABKIT_BOOTSTRAP does not apply here).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from labkit.kafka.localcluster import LocalCluster, private_cluster


@contextlib.contextmanager
def failure_lab(announce: Callable[[str], None] = print) -> Iterator[LocalCluster]:
    """A private lab to break: one KRaft controller and brokers 1-3, stopped on every way out."""
    announce("This experiment kills brokers, so it starts a Kafka of its own on this machine "
             "(a controller and brokers 1-3), whatever cluster your other lessons use.")
    with private_cluster("failure-lab-", brokers=3, controller="dedicated") as lab:
        yield lab
