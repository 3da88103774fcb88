"""Flink, the third engine: PyFlink's two-phase-commit Kafka sink, crashed from outside and
audited. The job runs in PyFlink's own environment (``environment``), as a child process
the lab SIGKILLs at a named moment of a checkpoint (``aim``) and restarts from the latest
retained checkpoint (``clients``), as a supervisor would. Its experiments:
``labkit.experiments.flink``."""
