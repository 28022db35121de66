"""Offset ranges: what a micro-batch reads per partition, split into Spark input partitions, and
the read limits that bound it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from sparkafka.connector.kafka_admin import (
    PartitionOffsets,
    TopicPartitionKey,
)


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark input partition: records of ``topic``/``partition`` with ``start <= offset < end``."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Offsets in the range; the number of records may be lower (control records, aborted data)."""
        return self.end - self.start


def offset_ranges(
    start: Mapping[TopicPartitionKey, int], end: Mapping[TopicPartitionKey, int]
) -> list[OffsetRange]:
    """The non-empty ranges between two source offsets, in topic-partition order.

    A partition only in ``end`` was discovered while planning ``end``: its end value is where
    reading will begin, so it contributes nothing to this batch. A partition only in ``start`` is
    gone. A partition whose end is below its start was reset (see ``latestOffset``)."""
    return [
        OffsetRange(topic, partition, start[(topic, partition)], until)
        for (topic, partition), until in sorted(end.items())
        if (topic, partition) in start and until > start[(topic, partition)]
    ]


def split_offset_ranges(
    ranges: Sequence[OffsetRange], *, min_partitions: int | None, max_records_per_partition: int | None
) -> list[OffsetRange]:
    """Split large ranges so that no range exceeds ``max_records_per_partition`` and there are at
    least ``min_partitions`` ranges (when the offsets allow it).

    Like Spark's KafkaOffsetRangeCalculator, ranges are split in proportion to their size, small
    ranges stay whole, and the result depends only on the input (deterministic replay)."""
    result = [r for r in ranges if r.size > 0]
    if max_records_per_partition is not None:
        result = [
            piece for r in result for piece in _split_evenly(r, math.ceil(r.size / max_records_per_partition))
        ]
    if min_partitions is None or len(result) >= min_partitions:
        return result

    total = sum(r.size for r in result)

    def part_count(size: int, of_total: int, parts: int) -> int:
        return max(math.floor(size / of_total * parts + 0.5), 1)

    unsplit = [r for r in result if part_count(r.size, total, min_partitions) == 1]
    split_total = total - sum(r.size for r in unsplit)
    split_parts = max(min_partitions - len(unsplit), 1)
    proportional = [
        piece
        for r in result
        for piece in _split_evenly(r, 1 if r in unsplit else part_count(r.size, split_total, split_parts))
    ]
    # Rounding can leave fewer ranges than asked for: halve the largest until there are enough.
    while len(proportional) < min_partitions:
        largest = max(proportional, key=lambda r: r.size)
        if largest.size < 2:
            break
        index = proportional.index(largest)
        proportional[index : index + 1] = _split_evenly(largest, 2)
    return proportional


def _split_evenly(r: OffsetRange, parts: int) -> list[OffsetRange]:
    parts = max(1, min(parts, r.size))
    pieces = []
    start = r.start
    remaining = r.size
    for part in range(parts):
        length = remaining // (parts - part)
        pieces.append(OffsetRange(r.topic, r.partition, start, start + length))
        start += length
        remaining -= length
    return pieces


def rate_limit(
    limit: int, start: Mapping[TopicPartitionKey, int], latest: Mapping[TopicPartitionKey, int]
) -> PartitionOffsets:
    """Cap the offsets of one micro-batch at ``limit`` in total, shared by the partitions in
    proportion to their backlog (Spark's KafkaMicroBatchStream.rateLimit).

    A partition with a backlog gets at least one offset so small partitions are never starved;
    partitions without a start offset (newly discovered) keep their end value unchanged."""
    backlog = {tp: until - start[tp] for tp, until in latest.items() if tp in start and until - start[tp] > 0}
    total = sum(backlog.values())
    if total < 1:
        return dict(latest)
    limited: PartitionOffsets = {}
    for tp, until in latest.items():
        if tp not in backlog:
            limited[tp] = until
            continue
        share = limit * (backlog[tp] / total)
        offsets = math.ceil(share) if share < 1 else math.floor(share)
        limited[tp] = min(until, start[tp] + offsets)
    return limited


def count_new_offsets(start: Mapping[TopicPartitionKey, int], end: Mapping[TopicPartitionKey, int]) -> int:
    return sum(max(0, until - start[tp]) for tp, until in end.items() if tp in start)
