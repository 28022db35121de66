"""sparkafka: exactly-once Kafka -> Spark -> Kafka pipelines for PySpark."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__version__ = "0.1.0"

__all__ = ["__version__", "register"]


def register(spark: SparkSession) -> None:
    """Register the ``sparkafka`` format with a SparkSession.

    After this, ``spark.readStream.format("sparkafka")`` and ``spark.read.format("sparkafka")`` read
    Kafka with the options of Spark's built-in Kafka source. Imported lazily so that the command
    line tools do not pay for importing PySpark."""
    from sparkafka.datasource import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)
