"""00 · tour: the exercise check measures on a copy (asking twice gives the same answer) and
a wrong answer gets a hint, not the offset."""
from __future__ import annotations

from confluent_kafka import Producer

from labkit.kafka import topics
from labkit.kafka.clientlog import client_config
from labkit.exercises.tour import check_tour, produce_three_more
from labkit.kafka.inspect import describe_topic


def test_the_check_leaves_the_topic_as_it_was(bootstrap, topic_name):
    topics.create(bootstrap, topic_name, partitions=3)
    producer = Producer(client_config({"bootstrap.servers": bootstrap, "enable.idempotence": True}))
    for key in ("acct-01", "acct-02", "acct-03", "acct-01", "acct-03"):
        producer.produce(topic_name, key=key, value=topics.encode({"amount": 1}))
    producer.flush(10)
    before = describe_topic(bootstrap, topic_name).offsets_frame()
    partition, offset = produce_three_more(bootstrap, topic_name)
    assert offset == before.loc[partition, "high_watermark"] + 2
    assert check_tour(bootstrap, topic_name, partition, offset).passed
    assert check_tour(bootstrap, topic_name, partition, offset).passed  # same question again
    assert describe_topic(bootstrap, topic_name).offsets_frame().equals(before)

    wrong_partition = check_tour(bootstrap, topic_name, (partition + 1) % 3, offset)
    assert not wrong_partition.passed and "does not go to partition" in wrong_partition.message
    wrong_offset = check_tour(bootstrap, topic_name, partition, offset + 1)
    assert not wrong_offset.passed and "right partition" in wrong_offset.message
    assert f"offset {offset}" not in wrong_offset.message  # a hint, not the answer
