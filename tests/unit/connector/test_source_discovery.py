"""When the stream reader looks for new partitions and topics (``partitionDiscoveryIntervalMs``),
against a fake cluster and a fake clock — no Kafka, no Spark."""

from __future__ import annotations

from collections.abc import Collection

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from .test_source_heartbeat import FakeAdmin, FakeClock, clock, offsets, reader_with

__all__ = ["clock"]  # the fixture, used by name


class GrowingAdmin(FakeAdmin):
    """Topic ``t`` gains a third partition once ``grow()`` is called; counts the metadata lookups."""

    def __init__(self) -> None:
        super().__init__()
        self.partition_count = 2
        self.lookups = 0

    def grow(self) -> None:
        self.partition_count = 3
        self.stable[("t", 2)] = 0

    def topic_partitions(self, topics: Collection[str] | None = None) -> dict[str, list[int]]:
        self.lookups += 1
        return {name: list(range(self.partition_count)) for name in ["t"] if topics is None or name in topics}


def discovered_after_growth(clock: FakeClock, waited_ms: int, **options: str) -> tuple[bool, int]:
    """Whether a micro-batch planned ``waited_ms`` after the topic grew includes the new partition,
    and how many metadata lookups the two batches made."""
    admin = GrowingAdmin()
    reader = reader_with(admin, **options)
    first = reader.latestOffset(offsets(0, 0), ReadAllAvailable())
    admin.grow()
    clock.advance(waited_ms)
    second = reader.latestOffset(first, ReadAllAvailable())
    return "2" in second["t"], admin.lookups


def test_by_default_every_micro_batch_looks_for_new_partitions_as_sparks_source(clock: FakeClock) -> None:
    assert discovered_after_growth(clock, 1) == (True, 2)


@pytest.mark.parametrize(("waited_ms", "found"), [(999, False), (1000, True)])
def test_an_interval_bounds_how_often(clock: FakeClock, waited_ms: int, found: bool) -> None:
    lookups = 2 if found else 1
    assert discovered_after_growth(clock, waited_ms, partitionDiscoveryIntervalMs="1000") == (found, lookups)


@pytest.mark.parametrize("interval", ["0", "-1"])
def test_a_non_positive_interval_never_looks_again(clock: FakeClock, interval: str) -> None:
    assert discovered_after_growth(clock, 3_600_000, partitionDiscoveryIntervalMs=interval) == (False, 1)
