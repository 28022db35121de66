"""sparkafka: exactly-once Kafka -> Spark -> Kafka pipelines for PySpark."""

__version__ = "0.1.0"

__all__ = ["__version__"]
