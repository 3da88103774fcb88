"""A produce loop whose delivery reports say what was written: the loop of notebooks 03b and
03c (each shows this code line for line), and what their experiments run when no loop is
given.

The experiment makes ``producer`` from the lesson's settings (``acks``, idempotence,
``message.timeout.ms``), hands ``payments`` over as its faults go (a broker frozen or cut
off between two of them) and reads ``acknowledged`` and ``failed`` afterwards: its audit
compares the ids this loop was told were written with what the partition holds. Each
record goes to partition 0: the experiments break one partition's replicas.
"""
from labkit.kafka import topics


def write_payments(producer, topic, payments, acknowledged, failed):
    def delivered(err, msg):  # the answer to one record, served by poll() and flush()
        if err is None:  # acknowledged, as acks defines it
            acknowledged.append(topics.decode(msg.value())["id"])
        else:  # refused or timed out: maybe written, maybe not
            failed.append(err.name())

    for payment in payments:  # handed over as the experiment goes, its faults in between
        producer.produce(topic, topics.encode(payment), partition=0, on_delivery=delivered)
        producer.poll(0)  # serve the answers that have come back meanwhile
    producer.flush(30)  # and the rest: each is answered within message.timeout.ms
