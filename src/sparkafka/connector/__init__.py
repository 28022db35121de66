"""The Spark connector: the ``sparkafka`` data source (source, sink, their options), the admin
queries and pooled clients they share, and the exactly-once replay rules. It speaks to Kafka only
through confluent-kafka and never imports the embedded broker."""
