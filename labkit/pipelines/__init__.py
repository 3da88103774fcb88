"""Reference pipelines, one module per scenario, each under one ``processing_guarantee``.

- ``producer``      source -> topic (acks, retries, idempotence, transactions)
- ``consumer``      topic -> database table (commit before / after / with the rows)
- ``ctp``           consume-transform-produce (offsets in the transaction)
- ``running_count`` a stateful count with a local store and a changelog topic
- ``autocommit``    what auto-commit commits, and where a crash would resume
- ``txn``           a transactional producer whose misuse errors say what to do
- ``guarantee``     the three processing guarantees, one class each: settings and commit order
- ``group``         reading the input as a consumer-group member: rebalances, batches, the end

Pipelines know nothing of the audit or of the fault runner: they call ``crash_point(...)``
at named places and otherwise do their job.
"""
from labkit.pipelines.guarantee import GUARANTEES, guarantee

__all__ = ["GUARANTEES", "guarantee"]
