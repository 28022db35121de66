"""Idle heartbeats of the source (``idleHeartbeatIntervalMs``): offset encoding, planning and the
heartbeat row, against a fake cluster and a fake clock — no Kafka, no Spark."""

from __future__ import annotations

import json
import pickle
from collections.abc import Collection, Iterable
from datetime import UTC, datetime

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

import sparkafka.connector.source.planning as planning_module
import sparkafka.connector.source.stream as source_module
from sparkafka.connector.kafka_admin import PartitionOffsets, TopicPartitionKey
from sparkafka.connector.source.heartbeat import (
    HeartbeatPartition,
    heartbeat_of,
    heartbeat_partition,
    next_heartbeat_ms,
)
from sparkafka.connector.source.offset_range import OffsetRange
from sparkafka.connector.source.offsets import (
    HEARTBEAT_OFFSET_KEY,
    SPLIT_KEY,
    UNRESOLVED_START_KEY,
    SourceOffset,
    Split,
    decode_offsets,
    encode_offsets,
)
from sparkafka.connector.source.options import SourceOptions
from sparkafka.connector.source.ranges import split_offset_ranges
from sparkafka.connector.source.schema import kafka_arrow_schema
from sparkafka.connector.source.stream import KafkaStreamReader
from sparkafka.errors import CheckpointVersionError, SparkafkaError, SparkafkaOptionError

INTERVAL_MS = 1000
T0, T1 = ("t", 0), ("t", 1)


def parse(**overrides: str) -> SourceOptions:
    options = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t", **overrides}
    return SourceOptions.parse({key.lower(): value for key, value in options.items()}).for_stream()


class FakeClock:
    """Stands in for the ``time`` module inside sparkafka.connector.source: monotonic and wall clock."""

    def __init__(self) -> None:
        self.now_s = 1000.0
        self.wall_ms = 1_700_000_000_000

    def monotonic(self) -> float:
        return self.now_s

    def time(self) -> float:
        return self.wall_ms / 1000

    def advance(self, milliseconds: int) -> None:
        self.now_s += milliseconds / 1000
        self.wall_ms += milliseconds


class FakeAdmin:
    """The part of KafkaAdmin the stream reader uses, over a topic ``t`` with two partitions.

    ``stable`` is each partition's last stable offset, ``open_until`` a higher high watermark for
    partitions with an open transaction."""

    def __init__(self) -> None:
        self.stable: dict[TopicPartitionKey, int] = {T0: 0, T1: 0}
        self.open_until: dict[TopicPartitionKey, int] = {}
        self.group_commits: list[PartitionOffsets] = []
        # Each partition's current leader epoch, None for a cluster that answers none.
        self.leader_epochs: dict[TopicPartitionKey, int] | None = None
        # Topic ids as a description by name finds them (KafkaAdmin.known_topic_ids).
        self.topic_ids: dict[str, tuple[int, int]] = {}
        self.known_topic_ids: dict[str, tuple[int, int]] = {}

    def topic_partitions(self, topics: Collection[str] | None = None) -> dict[str, list[int]]:
        if topics is not None:
            self.known_topic_ids.update(
                {name: self.topic_ids[name] for name in topics if name in self.topic_ids}
            )
        return {name: [0, 1] for name in ["t"] if topics is None or name in topics}

    def latest_offsets(
        self,
        partitions: Iterable[TopicPartitionKey],
        *,
        read_committed: bool,
        epochs: dict[TopicPartitionKey, int] | None = None,
    ) -> PartitionOffsets:
        ends = self.stable if read_committed else {**self.stable, **self.open_until}
        answered = {tp: ends[tp] for tp in partitions if tp in ends}
        if epochs is not None and self.leader_epochs is not None:
            epochs.update({tp: self.leader_epochs[tp] for tp in answered if tp in self.leader_epochs})
        return answered

    def earliest_offsets(self, partitions: Iterable[TopicPartitionKey]) -> PartitionOffsets:
        return {tp: 0 for tp in partitions if tp in self.stable}

    def commit_offsets(self, group_id: str, offsets: PartitionOffsets, *, retry: bool = True) -> None:
        self.group_commits.append(dict(offsets))

    def close(self) -> None:
        pass


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(source_module, "time", fake)
    monkeypatch.setattr(planning_module, "time", fake)
    return fake


def reader_with(admin: FakeAdmin, **options: str) -> KafkaStreamReader:
    reader = KafkaStreamReader(parse(**options))
    reader._admin = admin  # type: ignore[assignment]
    return reader


def offsets(t0: int, t1: int, heartbeat_ms: int | None = None) -> dict[str, dict[str, int]]:
    """A planned end offset, as the reader makes them: it records the (unset) split options."""
    return SourceOffset({T0: t0, T1: t1}, heartbeat_ms=heartbeat_ms, split=Split(None, None)).encode()


# -- offsets and partitions ------------------------------------------------------------------------


def test_heartbeat_entry_is_sorted_in_and_invisible_to_decode() -> None:
    encoded = encode_offsets({("a", 0): 3, ("z", 1): 4}, heartbeat_ms=42)
    assert encoded == {"a": {"0": 3}, HEARTBEAT_OFFSET_KEY: {"0": 42}, "z": {"1": 4}}
    assert list(encoded) == sorted(encoded)  # canonical JSON text for the engine's comparisons
    assert decode_offsets(encoded) == {("a", 0): 3, ("z", 1): 4}
    assert heartbeat_of(encoded) == 42
    assert heartbeat_of(encode_offsets({("a", 0): 3})) is None
    # The entry survives Spark's JSON round trip through the offsets log.
    assert heartbeat_of(json.loads(json.dumps(encoded))) == 42
    assert ":" in HEARTBEAT_OFFSET_KEY, "':' is not allowed in Kafka topic names: no collision"


def test_a_heartbeat_is_planned_only_when_the_entry_grew() -> None:
    assert heartbeat_partition(offsets(1, 1), offsets(1, 1, 500)) == HeartbeatPartition(500)
    assert heartbeat_partition(offsets(1, 1, 400), offsets(1, 1, 500)) == HeartbeatPartition(500)
    assert heartbeat_partition(offsets(1, 1, 500), offsets(3, 1, 500)) is None  # carried forward
    assert heartbeat_partition(offsets(1, 1, 500), offsets(3, 1)) is None


def test_heartbeat_times_only_increase() -> None:
    assert next_heartbeat_ms(None, 1000) == 1000
    assert next_heartbeat_ms(900, 1000) == 1000
    assert next_heartbeat_ms(1000, 1000) == 1001
    assert next_heartbeat_ms(5000, 1000) == 5001  # the wall clock went back


def test_partitions_add_one_heartbeat_partition_to_the_ranges_deterministically() -> None:
    reader = KafkaStreamReader(parse())
    start, end = offsets(2, 5, 100), offsets(4, 5, 200)
    planned = reader.partitions(start, end)
    assert planned == [OffsetRange("t", 0, 2, 4), HeartbeatPartition(200)]
    # A replay (offsets read back from the checkpoint) plans exactly the same.
    assert reader.partitions(json.loads(json.dumps(start)), json.loads(json.dumps(end))) == planned
    assert pickle.loads(pickle.dumps(HeartbeatPartition(200))) == HeartbeatPartition(200)


@pytest.mark.parametrize("include_headers", [False, True])
def test_the_heartbeat_row(include_headers: bool) -> None:
    reader = KafkaStreamReader(parse(includeHeaders=str(include_headers).lower()))
    batches = list(reader.read(HeartbeatPartition(1_700_000_012_345)))
    assert len(batches) == 1
    batch = batches[0]
    assert batch.schema.equals(kafka_arrow_schema(include_headers))
    row = batch.to_pylist()
    assert len(row) == 1
    expected = {
        "key": None,
        "value": None,
        "topic": "",
        "partition": -1,
        "offset": -1,
        "timestamp": datetime(2023, 11, 14, 22, 13, 32, 345000, tzinfo=UTC),
        "timestampType": -1,
    }
    if include_headers:
        expected["headers"] = None
    assert row[0] == expected
    # Deterministic: reading it again gives the identical row.
    assert next(iter(reader.read(HeartbeatPartition(1_700_000_012_345)))).equals(batch)


# -- planning heartbeats in latestOffset -----------------------------------------------------------


def test_option_is_off_by_default_and_positive() -> None:
    assert parse().idle_heartbeat_interval_ms is None
    assert parse(idleHeartbeatIntervalMs="250").idle_heartbeat_interval_ms == 250
    with pytest.raises(SparkafkaOptionError, match="idleHeartbeatIntervalMs"):
        parse(idleHeartbeatIntervalMs="0")


def test_no_heartbeats_without_the_option(clock: FakeClock) -> None:
    reader = reader_with(FakeAdmin())
    start = offsets(0, 0)
    for _ in range(5):
        clock.advance(60_000)
        assert reader.latestOffset(start, ReadAllAvailable()) == start


def test_idle_input_gets_a_heartbeat_every_interval(clock: FakeClock) -> None:
    reader = reader_with(FakeAdmin(), idleHeartbeatIntervalMs=str(INTERVAL_MS))
    start = offsets(0, 0)
    # The first call starts the idle clock: the reader cannot know how long the input was idle.
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    clock.advance(INTERVAL_MS - 1)
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    clock.advance(1)
    first = reader.latestOffset(start, ReadAllAvailable())
    assert first == offsets(0, 0, clock.wall_ms)
    assert reader.partitions(start, first) == [HeartbeatPartition(clock.wall_ms)]

    # Right after the heartbeat batch: nothing new, the entry is carried forward (no batch).
    assert reader.latestOffset(first, ReadAllAvailable()) == first
    clock.advance(INTERVAL_MS)
    second = reader.latestOffset(first, ReadAllAvailable())
    assert heartbeat_of(second) == clock.wall_ms > heartbeat_of(first)  # type: ignore[operator]
    assert decode_offsets(second) == decode_offsets(start)


def test_new_records_restart_the_idle_clock_and_data_batches_carry_no_new_heartbeat(
    clock: FakeClock,
) -> None:
    admin = FakeAdmin()
    reader = reader_with(admin, idleHeartbeatIntervalMs=str(INTERVAL_MS))
    start = offsets(0, 0, 5)
    reader.latestOffset(start, ReadAllAvailable())
    clock.advance(5 * INTERVAL_MS)
    admin.stable[T0] = 3
    data = reader.latestOffset(start, ReadAllAvailable())
    assert data == offsets(3, 0, 5), "a data batch carries the old entry unchanged"
    assert reader.partitions(start, data) == [OffsetRange("t", 0, 0, 3)]

    clock.advance(INTERVAL_MS - 1)
    assert reader.latestOffset(data, ReadAllAvailable()) == data
    clock.advance(1)
    assert heartbeat_of(reader.latestOffset(data, ReadAllAvailable())) == clock.wall_ms


def test_records_held_back_by_min_offsets_per_trigger_are_not_idle(clock: FakeClock) -> None:
    admin = FakeAdmin()
    reader = reader_with(
        admin, idleHeartbeatIntervalMs=str(INTERVAL_MS), minOffsetsPerTrigger="100", maxTriggerDelay="1h"
    )
    start = offsets(0, 0)
    reader.latestOffset(start, ReadMinRows(100))  # the first trigger never waits; later ones do
    admin.stable[T1] = 2
    for _ in range(5):
        assert reader.latestOffset(start, ReadMinRows(100)) == start, "2 < 100 records: wait"
        clock.advance(INTERVAL_MS)


def test_rate_limited_batches_never_count_the_heartbeat(clock: FakeClock) -> None:
    admin = FakeAdmin()
    reader = reader_with(admin, idleHeartbeatIntervalMs=str(INTERVAL_MS), maxOffsetsPerTrigger="4")
    start = offsets(0, 0, 7)
    admin.stable.update({T0: 10, T1: 10})
    assert reader.latestOffset(start, ReadMaxRows(4)) == offsets(2, 2, 7)


def test_open_transactions_hold_heartbeats_back(clock: FakeClock) -> None:
    admin = FakeAdmin()
    admin.open_until[T1] = 5  # records 0..4 of partition 1 are in a transaction still open
    reader = reader_with(admin, idleHeartbeatIntervalMs=str(INTERVAL_MS))
    start = offsets(0, 0)
    reader.latestOffset(start, ReadAllAvailable())
    clock.advance(10 * INTERVAL_MS)
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    # read_uncommitted sees those records as soon as they are written: nothing to wait for.
    uncommitted = reader_with(
        admin, idleHeartbeatIntervalMs=str(INTERVAL_MS), **{"kafka.isolation.level": "read_uncommitted"}
    )
    admin.stable.update(admin.open_until)
    start = offsets(0, 5)
    uncommitted.latestOffset(start, ReadAllAvailable())
    clock.advance(INTERVAL_MS)
    assert heartbeat_of(uncommitted.latestOffset(start, ReadAllAvailable())) == clock.wall_ms


def test_available_now_never_plans_heartbeats(clock: FakeClock) -> None:
    reader = reader_with(FakeAdmin(), idleHeartbeatIntervalMs=str(INTERVAL_MS))
    reader.prepareForTriggerAvailableNow()
    start = offsets(0, 0, 3)
    for _ in range(3):
        clock.advance(10 * INTERVAL_MS)
        assert reader.latestOffset(start, ReadAllAvailable()) == start


def test_the_entry_is_no_partition_for_data_loss_discovery_or_the_consumer_group(clock: FakeClock) -> None:
    admin = FakeAdmin()
    # failOnDataLoss=true: had the entry been taken for a partition, it would be "gone" and fail.
    reader = reader_with(admin, idleHeartbeatIntervalMs=str(INTERVAL_MS), **{"kafka.group.id": "g"})
    start = offsets(0, 0, 9)
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    reader.commit(offsets(4, 0, 9))
    assert admin.group_commits[-1] == {T0: 4, T1: 0}
    assert all(HEARTBEAT_OFFSET_KEY not in str(commit) for commit in admin.group_commits)
    assert reader.reportLatestOffset() == encode_offsets({T0: 0, T1: 0})


# -- the split of a micro-batch, pinned in its end offset --------------------------------------------


def test_a_planned_batch_records_its_split_and_a_replay_plans_with_it(clock: FakeClock) -> None:
    admin = FakeAdmin()
    first_run = reader_with(admin, minPartitions="4", maxRecordsPerPartition="100")
    start = first_run.latestOffset(first_run.initialOffset(), ReadAllAvailable())
    admin.stable = {T0: 300, T1: 20}
    end = first_run.latestOffset(start, ReadAllAvailable())
    assert end[SPLIT_KEY] == {"calculator": 2, "maxRecordsPerPartition": 100, "minPartitions": 4}
    assert decode_offsets(end) == {T0: 300, T1: 20}
    planned = first_run.partitions(start, end)

    # Restarted with other split options, the replay of that batch is split as the first run was.
    replay = reader_with(admin, minPartitions="9", maxRecordsPerPartition="7")
    assert replay.partitions(start, end) == planned
    assert len(planned) == 4
    # The next batch is planned, and recorded, with the new options.
    admin.stable = {T0: 310, T1: 20}
    following = replay.latestOffset(end, ReadAllAvailable())
    assert SourceOffset.decode(following).split == Split(9, 7)
    assert replay.partitions(end, following) == split_offset_ranges(
        [OffsetRange("t", 0, 300, 310)], min_partitions=9, max_records_per_partition=7
    )


def test_offsets_checkpointed_before_the_split_was_recorded_plan_with_the_current_options() -> None:
    reader = reader_with(FakeAdmin(), minPartitions="3")
    old_format = encode_offsets({T0: 30, T1: 0})
    assert SourceOffset.decode(old_format).split is None
    assert len(reader.partitions(encode_offsets({T0: 0, T1: 0}), old_format)) == 3


@pytest.mark.parametrize(
    "starting", [{}, {"startingOffsets": "latest"}, {"startingTimestamp": "1700000000000"}]
)
def test_a_first_batch_planned_by_sparks_source_is_refused_when_its_start_is_unknown(
    starting: dict[str, str],
) -> None:
    """After a switch from format("kafka"): Spark planned micro-batch 0 (its end offset is bare) and
    never committed it; the start of a latest, timestamp or group query cannot be found again."""
    reader = reader_with(FakeAdmin(), **starting)
    start = reader.initialOffset()
    assert UNRESOLVED_START_KEY in start
    with pytest.raises(SparkafkaError, match=r"planned by another source.*sources/0/0"):
        reader.partitions(start, encode_offsets({T0: 50, T1: 50}))


def test_sparkafkas_own_first_batch_from_an_unresolved_start_reads_nothing_and_is_not_refused() -> None:
    admin = FakeAdmin()
    admin.stable = {T0: 40, T1: 30}
    reader = reader_with(admin)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert reader.partitions(start, end) == []
    # Replayed after a crash with startingOffsets changed to earliest: still empty, as Spark's source
    # keeps a query's start whatever the option says later.
    replay = reader_with(admin, startingOffsets="earliest")
    assert replay.partitions(replay.initialOffset(), end) == []


def test_a_batch_recorded_without_a_calculator_replays_with_the_first_one() -> None:
    """Such batches were planned by the calculator that halves ranges until there are minPartitions;
    Spark's own rounds 15 offsets in 3 partitions to 6 ranges for minPartitions 7."""
    T2 = ("t", 2)
    start = encode_offsets({T0: 0, T1: 0, T2: 0})
    ends = {T0: 5, T1: 5, T2: 5}
    recorded_by_first_version = {
        **encode_offsets(ends),
        SPLIT_KEY: {"maxRecordsPerPartition": 0, "minPartitions": 7},
    }
    assert len(reader_with(FakeAdmin(), minPartitions="7").partitions(start, recorded_by_first_version)) == 7
    unrecorded = encode_offsets(ends)
    assert len(reader_with(FakeAdmin(), minPartitions="7").partitions(start, unrecorded)) == 7
    planned_now = SourceOffset(ends, split=Split(7, None)).encode()
    assert len(reader_with(FakeAdmin(), minPartitions="7").partitions(start, planned_now)) == 6


def test_a_batch_planned_by_an_unknown_calculator_is_refused_not_split_some_other_way() -> None:
    end = {**encode_offsets({T0: 5, T1: 5}), SPLIT_KEY: {"calculator": 3, "minPartitions": 7}}
    with pytest.raises(CheckpointVersionError, match=r"calculator 3.*sparkafka version that checkpointed it"):
        reader_with(FakeAdmin()).partitions(encode_offsets({T0: 0, T1: 0}), end)


def test_an_unset_option_is_recorded_as_zero_and_read_back_as_unset() -> None:
    end = SourceOffset({T0: 5, T1: 5}, split=Split(None, None)).encode()
    assert end[SPLIT_KEY] == {"calculator": 2, "maxRecordsPerPartition": 0, "minPartitions": 0}
    assert SourceOffset.decode(end).split == Split(None, None)
    assert list(end) == sorted(end), "offset entries stay sorted: equal offsets serialise equally"
    assert decode_offsets(end) == {T0: 5, T1: 5}
