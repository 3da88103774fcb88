"""Kafka client log lines go through labkit.kafka.clientlog's logger, never as librdkafka's raw
``%N|`` lines on stderr; warnings the client heals by retrying are not shown."""
from __future__ import annotations

import re

from confluent_kafka import Producer

from labkit.kafka.clientlog import client_config, client_logger

RAW_LINE = re.compile(r"^%\d\|", re.M)


def test_a_client_error_is_one_lab_line_not_a_raw_librdkafka_line(capfd):
    producer = Producer(client_config({"bootstrap.servers": "127.0.0.1:1"}))  # nobody listens
    producer.produce("t", b"v")
    producer.poll(1.5)  # logs are handed to the logger while the client is polled
    err = capfd.readouterr().err
    assert "kafka client ERROR: FAIL" in err and "Connection refused" in err
    assert not RAW_LINE.search(err)


def test_self_healing_warnings_are_dropped_the_rest_shown(capfd):
    log = client_logger()
    log.warning("GETPID [rdkafka#producer-1] Broker: Coordinator load in progress: retrying")
    log.info("an info line")
    log.warning("something the learner should see")
    err = capfd.readouterr().err
    assert err == "kafka client WARNING: something the learner should see\n"
