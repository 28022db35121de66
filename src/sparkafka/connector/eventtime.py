"""Event time with the sparkafka source: idle heartbeats, and the helpers that keep them out of results.

Spark's watermark is the largest event time seen so far, over all partitions, minus the delay given
to ``withWatermark``; it only moves when rows arrive. One idle partition therefore never holds it
back (unlike Flink's per-partition minimum), but when the *whole* input goes idle the last
event-time window of an append-mode query never closes. The source option
``idleHeartbeatIntervalMs`` fixes that: once no partition has had new records for the interval,
each micro-batch planned while the input stays idle carries one synthetic heartbeat row (see
``sparkafka.connector.source``): key and value null, topic ``""``, partition -1, offset -1, timestampType -1,
and ``timestamp`` = the wall-clock time the heartbeat was planned. The watermark must see that row,
and the results must not::

    from pyspark.sql import functions as F
    from sparkafka.connector.eventtime import drop_heartbeats

    events = (
        spark.readStream.format("sparkafka")
        .option("kafka.bootstrap.servers", "localhost:9092")
        .option("subscribe", "clicks")
        .option("idleHeartbeatIntervalMs", "1000")
        .load()
    )
    counts = (
        drop_heartbeats(events.withWatermark("timestamp", "5 seconds"))  # after withWatermark
        .groupBy(F.window("timestamp", "10 seconds"))
        .count()
    )

When the event time comes from the payload, heartbeats (whose value is null) must still carry a
time into ``withWatermark``: use :func:`event_time_or_heartbeat`. The heartbeat time is the wall
clock, so it closes every window older than ``now - delay``: records appended to Kafka later than
``delay`` after their own timestamp become late (see docs/guarantees.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkafka.connector.source.offsets import HEARTBEAT_PARTITION
from sparkafka.errors import SparkafkaError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructField

__all__ = ["HEARTBEAT_PARTITION", "drop_heartbeats", "event_time_or_heartbeat", "is_heartbeat"]

# Metadata Spark puts on the event-time column of `withWatermark` (EventTimeWatermark.delayKey).
WATERMARK_METADATA_KEY = "spark.watermarkDelayMs"
# 0001-01-01T00:00:00Z, the earliest timestamp Spark can represent, in microseconds.
EARLIEST_SPARK_TIMESTAMP_MICROS = -62_135_596_800_000_000


def is_heartbeat(partition_column: str = "partition") -> Column:
    """True for the source's idle heartbeat rows: partition -1, which no Kafka partition has."""
    from pyspark.sql import functions as F

    return F.col(partition_column).eqNullSafe(HEARTBEAT_PARTITION)


def event_time_or_heartbeat(
    event_time: Column | str, *, partition_column: str = "partition", timestamp_column: str = "timestamp"
) -> Column:
    """An event-time column for ``withWatermark`` that heartbeats can move: ``event_time`` for
    records, the heartbeat time for heartbeats. Needed when the event time is parsed from the value,
    which a heartbeat does not have (its parsed time would be null, and null moves no watermark)::

        parsed = events.withColumn("event_time", event_time_or_heartbeat(F.col("order.created_at")))
        drop_heartbeats(parsed.withWatermark("event_time", "1 minute"))
    """
    from pyspark.sql import functions as F

    column = F.col(event_time) if isinstance(event_time, str) else event_time
    return F.when(is_heartbeat(partition_column), F.col(timestamp_column)).otherwise(column)


def drop_heartbeats(frame: DataFrame, *, partition_column: str = "partition") -> DataFrame:
    """``frame`` without the source's idle heartbeat rows. Call it right after ``withWatermark``,
    before anything that aggregates, joins or writes.

    Steps:
    1. Find the watermarked event-time column(s) by the metadata ``withWatermark`` puts on them; a
       streaming frame without one is an error: dropping heartbeats before ``withWatermark`` would
       hide them from the watermark, which is their only purpose.
    2. Filter with a predicate that keeps every record and no heartbeat, and that references the
       event-time column: Spark's optimizer pushes a filter below the watermark operator unless it
       references the event-time column (PushPredicateThroughNonJoin), and below the watermark the
       heartbeat would again be invisible to it. The reference is a comparison with the earliest
       timestamp Spark can represent, never true and not something the optimizer folds away (a
       null check would be, for a non-nullable column).
    """

    if partition_column not in frame.columns:
        raise SparkafkaError(
            f"drop_heartbeats: the frame has no column '{partition_column}' to recognise heartbeats by "
            f"(columns: {', '.join(frame.columns)}); keep the source's partition column until "
            "heartbeats are dropped, or name it with partition_column="
        )
    watermarked = [field for field in frame.schema.fields if WATERMARK_METADATA_KEY in field.metadata]
    if not watermarked:
        if frame.isStreaming:
            raise SparkafkaError(
                "drop_heartbeats must come after withWatermark: the watermark has to see the heartbeat "
                "rows to move while the input is idle. Use drop_heartbeats(frame.withWatermark(...)); "
                "a query without event time needs no heartbeats (leave idleHeartbeatIntervalMs unset)"
            )
        # Batch reads never contain heartbeats; the filter is for queries shared with streams.
        return frame.filter(~is_heartbeat(partition_column))
    keep = ~is_heartbeat(partition_column)
    for field in watermarked:
        keep = keep | _never_true_reference(field)
    return frame.filter(keep)


def _never_true_reference(field: StructField) -> Column:
    """A condition on ``field`` that is never true but that the optimizer cannot prove so."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    column = F.col(f"`{field.name}`")
    if isinstance(field.dataType, TimestampType | TimestampNTZType):
        earliest = F.timestamp_micros(F.lit(EARLIEST_SPARK_TIMESTAMP_MICROS)).cast(field.dataType)
        return column < earliest
    # A window struct (withWatermark on an aggregate's window): heartbeats were dropped before the
    # aggregate made it; the reference only pins the filter above the watermark.
    return column.isNull()
