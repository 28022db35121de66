"""Column functions that decode and encode Kafka values (JSON, Avro, Confluent Avro) and route
corrupt records; public as :mod:`sparkafka.functions`."""
