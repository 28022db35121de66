"""The ``sparkafka`` data source: one format name for reading (source) and writing (sink)."""

from __future__ import annotations

import functools
import logging

from pyspark.sql.types import StructType

from sparkafka.connector.sink.batch_plan import BatchPlan, read_batch_plan
from sparkafka.connector.sink.carry_over import carry_markers_over
from sparkafka.connector.sink.claims import settle_checkpoint_claim
from sparkafka.connector.sink.commit_log import ensure_marker_topic, marker_layout
from sparkafka.connector.sink.lease import hold_checkpoint_lease
from sparkafka.connector.sink.marker_snapshot import MarkerSnapshot, snapshot_for_run
from sparkafka.connector.sink.options import (
    BATCH_ID_OPTION,
    PREVIOUS_MARKER_TOPIC_OPTION,
    SinkOptions,
    validate_input_schema,
)
from sparkafka.connector.sink.transactional_ids import (
    effective_prefix,
    require_batch_write_prefix,
)
from sparkafka.connector.sink.writer import KafkaBatchWriter, KafkaStreamWriter
from sparkafka.connector.source.data_source import KafkaSource
from sparkafka.errors import SparkafkaOptionError

log = logging.getLogger(__name__)


def _carry_markers_over(options: SinkOptions, plan: BatchPlan | None) -> None:
    if plan is None or plan.query_id is None:
        raise SparkafkaOptionError(
            f"option {PREVIOUS_MARKER_TOPIC_OPTION} needs the query's checkpoint, to learn which query's "
            "markers to carry over, and the sink could not read it: set the checkpoint with "
            ".option('checkpointLocation', ...) on the writeStream (a path the driver's Python can read)"
        )
    prefix = effective_prefix(options, plan.query_id)
    carry_markers_over(options, plan.query_id, prefix)


def _require_checkpoint(options: SinkOptions, *, batch_write: bool) -> None:
    """The sink reads the checkpoint's offsets log to tell a replayed micro-batch from one planned
    anew after the checkpoint went back, and records its prefix claim there (claims module)."""
    if options.checkpoint_location is not None:
        return
    where = (
        "in df.write (inside foreachBatch, the only place it works) needs the streaming query's "
        "checkpoint named on the write too, .option('checkpointLocation', <the path given to "
        "writeStream>): Spark hands a batch write nothing of the query"
        if batch_write
        else "needs the query's checkpoint named on the writeStream with .option('checkpointLocation', "
        "...): Spark hands a sink only that option, not a location derived from "
        "spark.sql.streaming.checkpointLocation"
    )
    raise SparkafkaOptionError(
        f"deliveryGuarantee=exactly-once {where}. The sink reads the checkpoint's offsets log to tell a "
        "replayed micro-batch from one planned anew after the checkpoint went back (restored from an "
        "older copy), and records there which commit-marker topic holds the query's markers; without "
        "it such a batch could be skipped or written twice"
    )


def _settled_plan(
    options: SinkOptions, *, batch_write: bool
) -> tuple[BatchPlan | None, MarkerSnapshot | None]:
    """On the driver, before the batch's tasks: the batch's plan from the checkpoint, the markers
    carried over where asked, the prefix's claim settled and recorded in the checkpoint, and what the
    commit log holds of the query for the tasks of a run's first batch (:mod:`.marker_snapshot`)."""
    topic_id = ensure_marker_topic(options)
    plan = settle_checkpoint_claim(
        options,
        read_batch_plan(options.checkpoint_location),
        batch_write=batch_write,
        carry_over=functools.partial(_carry_markers_over, options),
    )
    if plan is None or plan.query_id is None:
        return plan, None
    prefix = effective_prefix(options, plan.query_id)
    return plan, snapshot_for_run(options, marker_layout(options), prefix, plan.query_id, topic_id)


def _declared_plan(options: SinkOptions, plan: BatchPlan | None) -> BatchPlan | None:
    """Option batchId (a foreachBatch df.write from a Spark Connect client) must name the micro-batch
    the checkpoint is writing, its newest offsets-log entry: the write takes that batch's query and
    id from the checkpoint, and another number would file its output under another batch."""
    declared = options.batch_id
    if declared is None:
        return plan
    if plan is None or plan.query_id is None:
        raise SparkafkaOptionError(
            f"option {BATCH_ID_OPTION}={declared} needs the streaming query's checkpoint, readable from the "
            f"driver, at checkpointLocation ({options.checkpoint_location}): its offsets log and metadata "
            "name the micro-batch and the query the write belongs to, and they could not be read"
        )
    if plan.batch_id != declared:
        raise SparkafkaOptionError(
            f"option {BATCH_ID_OPTION}={declared}, and the checkpoint at {options.checkpoint_location} is "
            f"writing micro-batch {plan.batch_id}: give the write the batch id foreachBatch passed to the "
            "function, and the checkpointLocation of that same query"
        )
    return plan


class KafkaDataSource(KafkaSource):
    """``spark.readStream.format("sparkafka")`` and ``df.writeStream.format("sparkafka")``."""

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        """Spark calls this on the driver for every micro-batch, after writing the batch's entry of
        the offsets log: the writer takes the batch's plan from the checkpoint with it."""
        options = SinkOptions.parse(self.options)
        validate_input_schema(schema, options)
        if options.checkpoint_location is not None:
            hold_checkpoint_lease(options.checkpoint_location, options.lease_timeout_ms)
        if options.delivery_guarantee != "exactly-once":
            return KafkaStreamWriter(options)
        _require_checkpoint(options, batch_write=False)
        plan, snapshot = _settled_plan(options, batch_write=False)
        return KafkaStreamWriter(options, plan=plan, snapshot=snapshot)

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
        if options.checkpoint_location is not None:
            hold_checkpoint_lease(options.checkpoint_location, options.lease_timeout_ms)
        if options.delivery_guarantee != "exactly-once":
            return KafkaBatchWriter(options)
        _require_checkpoint(options, batch_write=True)
        plan, snapshot = _settled_plan(options, batch_write=True)
        return KafkaBatchWriter(options, _declared_plan(options, plan), snapshot)
