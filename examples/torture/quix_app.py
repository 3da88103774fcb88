"""A quixstreams (https://quix.io) pipeline, as its users write one: an Application with a
StreamingDataFrame that reads LABKIT_INPUT_TOPIC, adds a field to each record (keeping its
``id``) and writes it to LABKIT_OUTPUT_TOPIC. The one knob is quixstreams' own
``processing_guarantee``:

- "at-least-once": output is produced as it is processed; the consumed offsets are
  committed every ``commit_interval`` seconds after the producer is flushed. A kill between
  two commits replays everything since the last one: duplicates.
- "exactly-once": the output and the offsets go into one Kafka transaction per commit
  interval; a kill aborts the open transaction and the replay rewrites it: no duplicates.

quixstreams 3.28 needs confluent-kafka < 2.13 while the lab pins 2.16.1, so this file runs
in an environment of its own (``labkit.torture.apps.quix_command()`` creates it under .cache/):

    labkit torture --records 2000 --kills 3 --seed 1 -- \\
        .cache/apps/quixstreams-venv/bin/python examples/torture/quix_app.py --guarantee at-least-once
"""
import argparse
import os
import tempfile

from quixstreams import Application
from quixstreams.kafka import ConnectionConfig

from kafka_config import kafka_config  # LABKIT_KAFKA_CONFIG: TLS and credentials, when set


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--guarantee", choices=("at-least-once", "exactly-once"),
                      default=os.environ.get("QUIX_PROCESSING_GUARANTEE", "exactly-once"),
                      help="quixstreams' processing_guarantee (or $QUIX_PROCESSING_GUARANTEE)")
    args.add_argument("--commit-interval", type=float, default=5.0,
                      help="seconds between commits (quixstreams' default, 5)")
    opts = args.parse_args()
    group = os.environ["LABKIT_GROUP_ID"]
    app = Application(
        # The address plus the cluster's connection settings (quixstreams' own type for them).
        broker_address=ConnectionConfig.from_librdkafka_dict(
            {**kafka_config(), "bootstrap.servers": os.environ["LABKIT_BOOTSTRAP"]}),
        consumer_group=group,
        auto_offset_reset="earliest",
        commit_interval=opts.commit_interval,
        processing_guarantee=opts.guarantee,
        # Static membership: a restarted instance takes its predecessor's partitions at once
        # instead of waiting for the dead member's session (45 s) to time out.
        consumer_extra_config={"group.instance.id": f"{group}-1"},
        # A stable transactional.id (quixstreams draws a random one per start otherwise):
        # the restarted producer fences its killed predecessor and aborts its open
        # transaction at once, instead of leaving it open until transaction.timeout.ms.
        # (Only with transactions: librdkafka makes any producer with one transactional.)
        producer_extra_config=({"transactional.id": os.environ["LABKIT_TRANSACTIONAL_ID"]}
                               if opts.guarantee == "exactly-once" else {}),
        # The topics are the harness's; a stateless app keeps no state, but quixstreams
        # wants a state directory: a throwaway one, never the current directory.
        auto_create_topics=False,
        state_dir=tempfile.mkdtemp(prefix="quix-state-"),
        loglevel="WARNING",
    )
    source = app.topic(os.environ["LABKIT_INPUT_TOPIC"], value_deserializer="json",
                       key_deserializer="bytes")
    sink = app.topic(os.environ["LABKIT_OUTPUT_TOPIC"], value_serializer="json",
                     key_serializer="bytes")
    sdf = app.dataframe(source)
    sdf = sdf.apply(lambda record: {**record, "processed_by": "quixstreams"})
    sdf.to_topic(sink)
    app.run()


if __name__ == "__main__":
    main()
