"""The cost of a guarantee, measured (notebook 09): lanes of records sent and read under
each guarantee (``lane``), a learner's transactional loop run as one (``loop_run``), paired
rounds interleaved so that a shared machine's drift falls on both sides alike (``bench``),
what the rounds say (``findings``) and the published figures beside them (``published``).
A measurement, not an experiment: it registers nothing and audits nothing."""
