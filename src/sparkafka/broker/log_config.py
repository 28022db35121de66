"""A partition log's settings: the topic configs a log acts on, as Kafka's LogConfig holds them,
checked together when a topic is created or its configs change."""

from __future__ import annotations

from dataclasses import dataclass

from sparkafka.broker.log_segment import OFFSET_ENTRY, TIME_ENTRY
from sparkafka.broker.records import HEADER_SIZE, INT32_MAX
from sparkafka.broker.topic_configs import default_float, default_int, default_text

_POLICIES = ("delete", "compact")


@dataclass
class LogConfig:
    segment_bytes: int = default_int("segment.bytes")
    # segment.ms: the active segment rolls once an append's records are this much newer than its
    # first batch; segment.jitter.ms takes a random amount off that per segment, so that the
    # segments of many partitions do not all roll at once.
    segment_ms: int = default_int("segment.ms")
    segment_jitter_ms: int = default_int("segment.jitter.ms")
    index_interval_bytes: int = default_int("index.interval.bytes")
    # segment.index.bytes: the most bytes each index file of a segment may take; a full index rolls
    # the segment (Kafka's OffsetIndex/TimeIndex isFull, entries of 8 and 12 bytes).
    segment_index_bytes: int = default_int("segment.index.bytes")
    retention_ms: int = default_int("retention.ms")  # -1 = keep forever
    retention_bytes: int = default_int("retention.bytes")  # -1 = no size limit
    cleanup_policy: str = default_text("cleanup.policy")  # "delete" | "compact" | "compact,delete"
    delete_retention_ms: int = default_int("delete.retention.ms")
    min_compaction_lag_ms: int = default_int("min.compaction.lag.ms")
    max_compaction_lag_ms: int = default_int("max.compaction.lag.ms")
    # min.cleanable.dirty.ratio: a compacted log is cleaned once its dirty part is more than this
    # share of it (or max.compaction.lag.ms is overdue), see PartitionLog.cleanable_range.
    min_cleanable_dirty_ratio: float = default_float("min.cleanable.dirty.ratio")
    max_message_bytes: int = default_int("max.message.bytes")
    # message.timestamp.type=LogAppendTime: batches from clients get the broker's append time.
    log_append_time: bool = False
    # CreateTime topics refuse records stamped further than this before or after the broker's clock
    # (message.timestamp.before.max.ms / after.max.ms, Kafka 4's defaults: unbounded / one hour).
    timestamp_before_max_ms: int = default_int("message.timestamp.before.max.ms")
    timestamp_after_max_ms: int = default_int("message.timestamp.after.max.ms")
    # flush.messages: fsync once this many records were appended since the last fsync; None leaves it
    # to the OS (survives SIGKILL, not power loss).
    flush_messages: int | None = None

    def __post_init__(self) -> None:
        if not HEADER_SIZE <= self.segment_bytes <= INT32_MAX:
            raise ValueError(
                f"segment_bytes must be between {HEADER_SIZE} and {INT32_MAX} (index positions are int32), "
                f"got {self.segment_bytes}"
            )
        if self.segment_ms < 1:
            raise ValueError(f"segment_ms must be >= 1, got {self.segment_ms}")
        if self.segment_index_bytes < 4:
            raise ValueError(f"segment_index_bytes must be >= 4, got {self.segment_index_bytes}")
        names = (
            "segment_jitter_ms",
            "index_interval_bytes",
            "delete_retention_ms",
            "min_compaction_lag_ms",
            "max_compaction_lag_ms",
            "max_message_bytes",
            "timestamp_before_max_ms",
            "timestamp_after_max_ms",
        )
        for name in names:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("retention_ms", "retention_bytes"):
            if getattr(self, name) < -1:
                raise ValueError(f"{name} must be >= 0, or -1 for no limit, got {getattr(self, name)}")
        # Kafka 4's ValidList takes an empty list too: then the log is neither deleted nor compacted.
        policies = {part.strip() for part in self.cleanup_policy.split(",") if part.strip()}
        if not policies <= set(_POLICIES):
            raise ValueError(
                "cleanup_policy must list 'delete', 'compact', both or neither (''), "
                f"got {self.cleanup_policy!r}"
            )
        if not 0 <= self.min_cleanable_dirty_ratio <= 1:
            raise ValueError(
                f"min_cleanable_dirty_ratio must be between 0 and 1, got {self.min_cleanable_dirty_ratio}"
            )
        if self.flush_messages is not None and self.flush_messages < 1:
            raise ValueError(
                f"flush_messages must be >= 1 or None (leave flushing to the OS), got {self.flush_messages}"
            )

    @property
    def max_offset_index_entries(self) -> int:
        return self.segment_index_bytes // OFFSET_ENTRY.size

    @property
    def max_time_index_entries(self) -> int:
        return self.segment_index_bytes // TIME_ENTRY.size

    @property
    def max_segment_ms(self) -> int:
        """How old the active segment may grow (Kafka's LogConfig.maxSegmentMs): a compacted topic
        rolls by max.compaction.lag.ms too, since only closed segments are ever cleaned."""
        if self.compacts and self.max_compaction_lag_ms > 0:
            return min(self.max_compaction_lag_ms, self.segment_ms)
        return self.segment_ms

    @property
    def deletes(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def compacts(self) -> bool:
        return "compact" in self.cleanup_policy
