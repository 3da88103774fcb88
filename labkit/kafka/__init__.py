"""The system under test: Kafka brokers (local or external), their jars, the secure lab,
connection settings, names, topics, the wire protocol and the inspector."""
