"""The ``sparkafka`` data source: one format name for reading (source) and writing (sink)."""

from __future__ import annotations

import functools
import logging

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

log = logging.getLogger(__name__)


def _carry_markers_over(options: SinkOptions, plan: BatchPlan | None) -> None:
    if plan is None or plan.query_id is None:
        raise SparkafkaOptionError(
            f"option {PREVIOUS_MARKER_TOPIC_OPTION} needs the query's checkpoint, to learn which query's "
            "markers to carry over, and the sink could not read it: set the checkpoint with "
            ".option('checkpointLocation', ...) on the writeStream (a path the driver's Python can read)"
        )
    prefix = options.transactional_id_prefix or default_transactional_id_prefix(plan.query_id)
    carry_markers_over(options, plan.query_id, prefix)


@functools.cache
def _warn_batch_write_without_checkpoint_once() -> None:
    log.warning(
        "an exactly-once df.write inside foreachBatch without .option('checkpointLocation', <the "
        "streaming query's checkpoint>): a micro-batch planned anew after the checkpoint went back "
        "(restored from an older copy) is then recognised by its batch id only, and one planned "
        "anew with the same id and row counts would be skipped or written twice (docs/guarantees.md)"
    )


class KafkaDataSource(_SourceDataSource):
    """``spark.readStream.format("sparkafka")`` and ``df.writeStream.format("sparkafka")``."""

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        """Spark calls this on the driver for every micro-batch, after writing the batch's entry of
        the offsets log: the writer takes the batch's plan from the checkpoint with it."""
        options = SinkOptions.parse(self.options)
        validate_input_schema(schema, options)
        if options.delivery_guarantee != "exactly-once":
            return KafkaStreamWriter(options)
        if options.checkpoint_location is None:
            raise SparkafkaOptionError(
                "deliveryGuarantee=exactly-once needs the query's checkpoint named on the writeStream with "
                ".option('checkpointLocation', ...): Spark hands a sink only that option, not a location "
                "derived from spark.sql.streaming.checkpointLocation, and the sink reads the checkpoint's "
                "offsets log to tell a replayed micro-batch from one planned anew after the checkpoint "
                "went back (restored from an older copy); without it such a batch could be skipped or "
                "written twice"
            )
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
        if options.delivery_guarantee != "exactly-once":
            return KafkaBatchWriter(options)
        ensure_marker_topic(options)
        if options.checkpoint_location is None:
            _warn_batch_write_without_checkpoint_once()
        return KafkaBatchWriter(options, read_batch_plan(options.checkpoint_location))
