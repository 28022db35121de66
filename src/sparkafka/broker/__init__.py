"""An embedded single-node broker that speaks the Kafka wire protocol."""
