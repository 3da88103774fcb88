"""The columns every record sink writes (the database tables and the Delta tables alike),
in one place so the sinks, Delta and the checks agree without importing each other."""

RECORD_COLUMNS = ("id", "key", "value", "topic", "kafka_partition", "kafka_offset", "batch_id")
# Numbered by the database as rows are inserted: the write order an audit can trust.
SEQUENCE_COLUMN = "seq"
