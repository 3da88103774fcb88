"""The checking: ground truth from what is observable afterwards (the audit, its checkers),
a run's history and its timeline."""
