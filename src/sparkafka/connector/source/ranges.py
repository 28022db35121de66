"""Planning offset ranges (the driver's): what a micro-batch reads per partition, split into Spark
input partitions (:class:`~.offset_range.OffsetRange`), and the read limits that bound it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sparkafka.connector.kafka_admin import (
    PartitionOffsets,
    TopicPartitionKey,
)
from sparkafka.connector.source.offset_range import OffsetRange
from sparkafka.connector.source.offsets import LEGACY_CALCULATOR, SPARK_CALCULATOR
from sparkafka.errors import CheckpointVersionError


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
    ranges: Sequence[OffsetRange],
    *,
    min_partitions: int | None,
    max_records_per_partition: int | None,
    calculator: int = SPARK_CALCULATOR,
) -> list[OffsetRange]:
    """Split large ranges so that no range exceeds ``max_records_per_partition`` and there are
    about ``min_partitions`` ranges (at least that many with :data:`LEGACY_CALCULATOR`).

    As Spark's KafkaOffsetRangeCalculator: ranges are first cut to ``max_records_per_partition``;
    then, when there are fewer than ``min_partitions``, each range whose share of the offsets
    rounds to one part stays whole and the others are split in proportion to their size. The result
    depends only on the input (deterministic replay)."""
    if calculator not in (LEGACY_CALCULATOR, SPARK_CALCULATOR):
        raise CheckpointVersionError(
            f"a micro-batch was planned with offset-range calculator {calculator}, which this version "
            "of sparkafka does not know: replay it with the sparkafka version that checkpointed it"
        )
    result = [r for r in ranges if r.size > 0]
    if max_records_per_partition is not None:
        result = [
            piece for r in result for piece in _split_evenly(r, math.ceil(r.size / max_records_per_partition))
        ]
    if min_partitions is None or len(result) >= min_partitions or not result:
        return result

    total = sum(r.size for r in result)

    def part_count(size: int, of_total: int, parts: int) -> int:
        return max(math.floor(size / of_total * parts + 0.5), 1)

    unsplit = [r for r in result if part_count(r.size, total, min_partitions) == 1]
    split_total = total - sum(r.size for r in unsplit)
    split_parts = max(min_partitions - len(unsplit), 1)

    # Spark keeps whole every range of a topic partition one of whose ranges stays whole (after a
    # maxRecordsPerPartition cut a partition has several); the first calculator looked at each range.
    def unit(r: OffsetRange) -> object:
        return (r.topic, r.partition) if calculator == SPARK_CALCULATOR else r

    whole = {unit(r) for r in unsplit}
    proportional = [
        piece
        for r in result
        for piece in _split_evenly(r, 1 if unit(r) in whole else part_count(r.size, split_total, split_parts))
    ]
    # Rounding can leave fewer ranges than asked for: the first calculator halved the largest until
    # there were enough, Spark's keeps what rounding gives.
    while calculator == LEGACY_CALCULATOR and len(proportional) < min_partitions:
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
