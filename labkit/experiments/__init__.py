"""The experiments: each combines a pipeline, faults and the audit into one run."""
