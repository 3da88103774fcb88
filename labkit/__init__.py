"""labkit: the delivery-semantics lab's helpers, one idea per module.

Layers, top-down (the Jepsen split: data, pipelines, faults and audit never reach into
each other):

- ``cluster``   real Kafka brokers (start, SIGKILL, restart) or an external cluster
- ``faults``    named crash points in client code, a Kafka-aware network fault proxy
- ``pipelines`` reference apps, one per processing guarantee
- ``audit``     ground truth: what went in vs what is observable afterwards
- ``inspect``   protocol-level views: batches, markers, LSO, group offsets, producers
- ``widgets``   live dashboards and their static renderings
- ``spark``     SparkSession with the Kafka connector, streaming runner, sinks
- ``cli``       ``labkit up | down | status | scenario | crash-points | inspect``
"""
__version__ = "0.1.0"
