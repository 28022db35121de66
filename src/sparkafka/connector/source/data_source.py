"""The ``sparkafka`` data source's reading side: schema, stream and batch readers."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import (
    StructType,
)

from sparkafka.connector.kafka_admin import (
    validate_consumer_config,
)
from sparkafka.connector.source.batch import KafkaBatchReader
from sparkafka.connector.source.options import SOURCE_NAME, SourceOptions
from sparkafka.connector.source.schema import kafka_schema
from sparkafka.connector.source.stream import KafkaStreamReader
from sparkafka.errors import (
    SparkafkaOptionError,
)


class KafkaSource(DataSource):
    """The reading half of the ``sparkafka`` data source (``spark.readStream.format("sparkafka")`` /
    ``spark.read.format("sparkafka")``); :class:`sparkafka.connector.datasource.KafkaDataSource` adds
    the writing half."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        # Runs when the DataFrame is created (load()), so option mistakes surface there.
        options = SourceOptions.parse(self.options)
        validate_consumer_config(options.client_config)
        return kafka_schema(options.include_headers)

    def reader(self, schema: StructType) -> KafkaBatchReader:
        options = SourceOptions.parse(self.options)
        _require_fixed_schema(schema, options)
        return KafkaBatchReader(options.for_batch())

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        options = SourceOptions.parse(self.options)
        _require_fixed_schema(schema, options)
        return KafkaStreamReader(options.for_stream())


def _require_fixed_schema(schema: StructType, options: SourceOptions) -> None:
    expected = kafka_schema(options.include_headers)
    if schema != expected:
        raise SparkafkaOptionError(
            "Kafka source has a fixed schema and cannot be set with a custom one: "
            f"expected {expected.simpleString()}, got {schema.simpleString()}"
        )
