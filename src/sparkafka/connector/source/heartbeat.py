"""The idle heartbeat: a synthetic row per interval while the input is idle, so event-time
windows close (see :mod:`sparkafka.eventtime`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from sparkafka.connector.source.offsets import (
    HEARTBEAT_OFFSET,
    HEARTBEAT_PARTITION,
    HEARTBEAT_TIMESTAMP_TYPE,
    HEARTBEAT_TOPIC,
    heartbeat_of,
)
from sparkafka.connector.source.schema import kafka_arrow_schema

__all__ = [
    "HeartbeatPartition",
    "heartbeat_batch",
    "heartbeat_of",
    "heartbeat_partition",
    "next_heartbeat_ms",
]


def next_heartbeat_ms(previous_ms: int | None, now_ms: int) -> int:
    """The time of a new heartbeat: the wall clock, but strictly after the previous heartbeat even if
    the clock went back, so heartbeat times only increase (a smaller one would not be new)."""
    return now_ms if previous_ms is None else max(now_ms, previous_ms + 1)


@dataclass(frozen=True)
class HeartbeatPartition(InputPartition):
    """One Spark input partition whose read yields the single heartbeat row of time ``timestamp_ms``."""

    timestamp_ms: int


def heartbeat_partition(
    start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]
) -> HeartbeatPartition | None:
    """The heartbeat a micro-batch ``(start, end]`` emits: one when ``end`` has a later heartbeat
    than ``start`` (or ``start`` has none), else None. Depends on nothing but the two offsets, so a
    replayed batch emits the identical row."""
    until = heartbeat_of(end)
    if until is None:
        return None
    since = heartbeat_of(start)
    return HeartbeatPartition(until) if since is None or until > since else None


def heartbeat_batch(partition: HeartbeatPartition, include_headers: bool) -> pa.RecordBatch:
    """The one-row Arrow batch of a heartbeat, in the source's schema."""
    schema = kafka_arrow_schema(include_headers)
    columns: list[pa.Array] = [
        pa.array([None], pa.binary()),
        pa.array([None], pa.binary()),
        pa.array([HEARTBEAT_TOPIC], pa.string()),
        pa.array([HEARTBEAT_PARTITION], pa.int32()),
        pa.array([HEARTBEAT_OFFSET], pa.int64()),
        pa.array([partition.timestamp_ms * 1000], pa.timestamp("us", tz="UTC")),
        pa.array([HEARTBEAT_TIMESTAMP_TYPE], pa.int32()),
    ]
    if include_headers:
        columns.append(pa.array([None], schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
