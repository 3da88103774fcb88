"""labkit: the delivery-semantics lab, one folder per layer (docs/architecture.md).

Bottom to top, each importing only the layers below it:

- base (``settings``, ``paths``, ``proc``, ``progress``)   the environment, places, processes
- ``kafka``        the system under test: real brokers, clients' config, topics, the inspector
- ``checking``     the audit: what went in vs what is observable afterwards, one verdict
- ``faults``       crash points and their supervisor, the network fault proxy, the watchdog
- ``pipelines``    the reference apps, one per processing guarantee, and the learner's code
- ``spark``        Spark pipelines: session with the connector, crash-supervised runner, sinks
- ``experiments``  a pipeline + faults + the audit, one module each
- ``torture``      any app under kills and faults
- ``room``, ``widgets``, ``exercises``, ``cli``
"""
__version__ = "0.1.0"
