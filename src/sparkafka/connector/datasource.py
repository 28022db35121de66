"""The ``sparkafka`` data source: one format name for reading (source) and writing (sink)."""

from __future__ import annotations

from pyspark.sql.types import StructType

from sparkafka.connector.replay import PREVIOUS_MARKER_TOPIC_OPTION
from sparkafka.connector.sink.batch_plan import BatchPlan, read_batch_plan
from sparkafka.connector.sink.markers import ensure_marker_topic
from sparkafka.connector.sink.options import SinkOptions, validate_input_schema
from sparkafka.connector.sink.producers import carry_markers_over
from sparkafka.connector.sink.transactional_ids import (
    default_transactional_id_prefix,
    require_batch_write_prefix,
)
from sparkafka.connector.sink.writer import KafkaBatchWriter, KafkaStreamWriter
from sparkafka.connector.source.data_source import KafkaDataSource as _SourceDataSource
from sparkafka.errors import SparkafkaOptionError


def _carry_markers_over(options: SinkOptions, plan: BatchPlan | None) -> None:
    if plan is None or plan.query_id is None:
        raise SparkafkaOptionError(
            f"option {PREVIOUS_MARKER_TOPIC_OPTION} needs the query's checkpoint, to learn which query's "
            "markers to carry over, and the sink could not read it: set the checkpoint with "
            ".option('checkpointLocation', ...) on the writeStream (a path the driver's Python can read)"
        )
    prefix = options.transactional_id_prefix or default_transactional_id_prefix(plan.query_id)
    carry_markers_over(options, plan.query_id, prefix)


class KafkaDataSource(_SourceDataSource):
    """``spark.readStream.format("sparkafka")`` and ``df.writeStream.format("sparkafka")``."""

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        """Spark calls this on the driver for every micro-batch, after writing the batch's entry of
        the offsets log: the writer takes the batch's plan from the checkpoint with it."""
        options = SinkOptions.parse(self.options)
        validate_input_schema(schema, options)
        if options.delivery_guarantee != "exactly-once":
            return KafkaStreamWriter(options)
        ensure_marker_topic(options)
        plan = read_batch_plan(options.checkpoint_location)
        if options.previous_marker_topic is not None:
            _carry_markers_over(options, plan)
        return KafkaStreamWriter(options, plan=plan)

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
