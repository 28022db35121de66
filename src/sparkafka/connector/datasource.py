"""The ``sparkafka`` data source: one format name for reading (source) and writing (sink)."""

from __future__ import annotations

from pyspark.sql.types import StructType

from sparkafka.connector.sink.markers import ensure_marker_topic
from sparkafka.connector.sink.options import SinkOptions, validate_input_schema
from sparkafka.connector.sink.transactional_ids import require_batch_write_prefix
from sparkafka.connector.sink.writer import KafkaBatchWriter, KafkaStreamWriter
from sparkafka.connector.source.data_source import KafkaDataSource as _SourceDataSource
from sparkafka.errors import SparkafkaOptionError


class KafkaDataSource(_SourceDataSource):
    """``spark.readStream.format("sparkafka")`` and ``df.writeStream.format("sparkafka")``."""

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        options = SinkOptions.parse(self.options)
        validate_input_schema(schema, options)
        if options.delivery_guarantee == "exactly-once":
            ensure_marker_topic(options)
        return KafkaStreamWriter(options)

    def writer(self, schema: StructType, overwrite: bool) -> KafkaBatchWriter:
        if overwrite:
            # As Spark's KafkaSourceProvider: a topic cannot be truncated and rewritten.
            raise SparkafkaOptionError(
                "save mode 'overwrite' is not allowed for Kafka: records can only be appended; "
                "use .mode('append')"
            )
        options = SinkOptions.parse(self.options)
        require_batch_write_prefix(options)
        validate_input_schema(schema, options)
        if options.delivery_guarantee == "exactly-once":
            ensure_marker_topic(options)
        return KafkaBatchWriter(options)
