"""What a source offset holds in Spark's checkpoint: each partition's next offset, and the
source's own entries (``sparkafka:`` keys, never a topic name) that a replay plans from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sparkafka.connector.kafka_admin import (
    PartitionOffsets,
    TopicPartitionKey,
)
from sparkafka.errors import CheckpointFormatError

# The idle heartbeat's entry in a source offset: {HEARTBEAT_OFFSET_KEY: {HEARTBEAT_SLOT: time in ms}}.
# ':' is not allowed in Kafka topic names, so no topic can ever be mistaken for it (or vice versa).
HEARTBEAT_OFFSET_KEY = "sparkafka:idleHeartbeat"
HEARTBEAT_SLOT = "0"
# A new query's initial offset: "the starting offsets, not resolved yet" (see "Starting offsets" in
# the docstring of sparkafka.connector.source). The same constant whenever and however often the engine asks.
UNRESOLVED_START_KEY = "sparkafka:startingOffsets"
UNRESOLVED_START: dict[str, dict[str, int]] = {UNRESOLVED_START_KEY: {"0": 0}}
# A resolved initial offset (earliest, numbers, -2) carries this entry, so that latestOffset knows it
# plans the first micro-batch ...
INITIAL_OFFSET_KEY = "sparkafka:initialOffset"
# ... whose end offset then carries that batch's start, {FIRST_BATCH_START_PREFIX + topic:
# {partition: offset}}, checkpointed with it (see "Starting offsets" in sparkafka.connector.source).
FIRST_BATCH_START_PREFIX = "sparkafka:firstBatchStart:"
# Starting offsets an open transaction still holds back when a micro-batch runs for other partitions:
# {HELD_START_PREFIX + topic: {partition: offset}} in its end offset.
HELD_START_PREFIX = "sparkafka:heldStart:"
# How ranges are split to reach minPartitions. A micro-batch records the calculator it was planned
# with (Split, below), so a replay splits it as the first run did whatever version replays it.
# 1: sparkafka's first calculator, Spark's rounding followed by halving the largest range until there
#    are minPartitions ranges (used for batches checkpointed without a recorded calculator);
# 2: Spark's KafkaOffsetRangeCalculator exactly: rounding alone, so the count is only approximately
#    minPartitions (15 offsets in 3 partitions with minPartitions 7 give 6 ranges).
LEGACY_CALCULATOR = 1
SPARK_CALCULATOR = 2

# How a micro-batch's offset ranges are split into input partitions, recorded in its end offset so
# that a replay splits them as the first run did: {SPLIT_KEY: {"calculator": n, "minPartitions": n,
# "maxRecordsPerPartition": n}}, 0 where the option is not set (SPARK_CALCULATOR et al.).
SPLIT_KEY = "sparkafka:split"
# The leader epoch (KIP-320) each partition's leader had when the end offset was planned:
# {LEADER_EPOCH_PREFIX + topic: {partition: epoch}}. The next micro-batch asks the leader where that
# epoch ends now: below the offset, the log was truncated under the query (an unclean election).
LEADER_EPOCH_PREFIX = "sparkafka:leaderEpoch:"
# The id of each topic an end offset reads, where the cluster described the topic by name:
# {TOPIC_ID_PREFIX + topic: {"msb": int, "lsb": int}}. A truncation candidate in a topic whose id
# changed is a topic deleted and created again, not an unclean election.
TOPIC_ID_PREFIX = "sparkafka:topicId:"
# Offset entries of sparkafka's own: never a topic (':' cannot occur in a topic name).
OWN_ENTRY_PREFIX = "sparkafka:"
# What a heartbeat row carries where a record has its Kafka coordinates: "none" sentinels throughout
# (-1 is Kafka's "no partition" / "no offset" / NoTimestampType), so that no real record can look
# like one. Only its timestamp is meaningful.
HEARTBEAT_TOPIC = ""
HEARTBEAT_PARTITION = -1
HEARTBEAT_OFFSET = -1
HEARTBEAT_TIMESTAMP_TYPE = -1


def encode_offsets(
    offsets: Mapping[TopicPartitionKey, int], *, heartbeat_ms: int | None = None
) -> dict[str, dict[str, int]]:
    """``{(topic, partition): offset}`` -> Spark's ``{"topic": {"partition": offset}}``, sorted, plus
    the idle heartbeat entry when ``heartbeat_ms`` is given (sorted in among the topics)."""
    encoded: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        encoded.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    if heartbeat_ms is not None:
        encoded[HEARTBEAT_OFFSET_KEY] = {HEARTBEAT_SLOT: int(heartbeat_ms)}
        encoded = dict(sorted(encoded.items()))
    return encoded


def heartbeat_of(encoded: Mapping[str, Mapping[str, int]]) -> int | None:
    """The idle heartbeat time (ms) recorded in a source offset, None if it has none."""
    entry = encoded.get(HEARTBEAT_OFFSET_KEY)
    if not entry or HEARTBEAT_SLOT not in entry:
        return None
    return int(entry[HEARTBEAT_SLOT])


def decode_offsets(encoded: Mapping[str, Mapping[str, int]]) -> PartitionOffsets:
    """Spark's offset JSON -> ``{(topic, partition): offset}``: real topic partitions only, the idle
    heartbeat entry (read it with :func:`heartbeat_of`) and the unresolved start are left out."""
    return {
        (topic, int(partition)): int(offset)
        for topic, by_partition in encoded.items()
        if not topic.startswith(OWN_ENTRY_PREFIX)
        for partition, offset in by_partition.items()
    }


def _with_first_batch_start(
    end: Mapping[str, Mapping[str, int]], start: Mapping[TopicPartitionKey, int]
) -> dict[str, dict[str, int]]:
    """``end`` plus the first micro-batch's ``start`` in entries of its own, sorted in."""
    return _with_entries(end, FIRST_BATCH_START_PREFIX, start)


def _with_held_starts(
    end: Mapping[str, Mapping[str, int]], held: Mapping[TopicPartitionKey, int]
) -> dict[str, dict[str, int]]:
    """``end`` plus the starting offsets an open transaction still holds back, in entries of their
    own, so that the next micro-batch keeps holding them rather than take them for data loss."""
    return _with_entries(end, HELD_START_PREFIX, held)


def _held_starts(encoded: Mapping[str, Mapping[str, int]]) -> PartitionOffsets:
    """The held starting offsets an offset carries (:func:`_with_held_starts`)."""
    return _entries(encoded, HELD_START_PREFIX)


def _with_leader_epochs(
    end: Mapping[str, Mapping[str, int]], epochs: Mapping[TopicPartitionKey, int]
) -> dict[str, dict[str, int]]:
    """``end`` plus the leader epoch of each partition it ends in, in entries of their own."""
    return _with_entries(end, LEADER_EPOCH_PREFIX, epochs)


def _leader_epochs(encoded: Mapping[str, Mapping[str, int]]) -> dict[TopicPartitionKey, int]:
    """The leader epochs an offset carries (:func:`_with_leader_epochs`); empty in offsets checkpointed
    before sparkafka recorded them, and in Spark's kafka format's."""
    return _entries(encoded, LEADER_EPOCH_PREFIX)


def _with_topic_ids(
    end: Mapping[str, Mapping[str, int]], ids: Mapping[str, tuple[int, int]]
) -> dict[str, dict[str, int]]:
    """``end`` plus the id of each of its topics in ``ids`` (:data:`TOPIC_ID_PREFIX`)."""
    merged = {key: dict(value) for key, value in end.items()}
    read = {topic for topic, _ in decode_offsets(end)}
    for topic in sorted(read & set(ids)):
        msb, lsb = ids[topic]
        merged[TOPIC_ID_PREFIX + topic] = {"lsb": int(lsb), "msb": int(msb)}
    return dict(sorted(merged.items()))


def _topic_ids(encoded: Mapping[str, Mapping[str, int]]) -> dict[str, tuple[int, int]]:
    """The topic ids an offset carries (:func:`_with_topic_ids`)."""
    # The zero id, which a cluster without topic ids answers, names no topic (checkpoints written
    # before sparkafka knew that may hold it).
    return {
        key[len(TOPIC_ID_PREFIX) :]: (int(value["msb"]), int(value["lsb"]))
        for key, value in encoded.items()
        if key.startswith(TOPIC_ID_PREFIX)
        and "msb" in value
        and "lsb" in value
        and (int(value["msb"]), int(value["lsb"])) != (0, 0)
    }


def _with_entries(
    end: Mapping[str, Mapping[str, int]], prefix: str, offsets: Mapping[TopicPartitionKey, int]
) -> dict[str, dict[str, int]]:
    merged = {key: dict(value) for key, value in end.items()}
    for (topic, partition), offset in sorted(offsets.items()):
        merged.setdefault(prefix + topic, {})[str(partition)] = int(offset)
    return dict(sorted(merged.items()))


def _entries(encoded: Mapping[str, Mapping[str, int]], prefix: str) -> PartitionOffsets:
    return {
        (key[len(prefix) :], int(partition)): int(offset)
        for key, by_partition in encoded.items()
        if key.startswith(prefix)
        for partition, offset in by_partition.items()
    }


def _marked_initial(offsets: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Resolved starting offsets, marked as such for :meth:`KafkaStreamReader.latestOffset`."""
    return dict(sorted({**offsets, INITIAL_OFFSET_KEY: {"0": 0}}.items()))


@dataclass(frozen=True)
class Split:
    """The source options that split a micro-batch's offset ranges into Spark input partitions."""

    min_partitions: int | None
    max_records_per_partition: int | None
    # Batches checkpointed before the calculator was recorded were split by the first one.
    calculator: int = SPARK_CALCULATOR

    def encode(self) -> dict[str, int]:
        return {
            "calculator": self.calculator,
            "maxRecordsPerPartition": self.max_records_per_partition or 0,
            "minPartitions": self.min_partitions or 0,
        }

    @classmethod
    def decode(cls, entry: Mapping[str, int]) -> Split:
        return cls(
            min_partitions=int(entry.get("minPartitions", 0)) or None,
            max_records_per_partition=int(entry.get("maxRecordsPerPartition", 0)) or None,
            calculator=int(entry.get("calculator", LEGACY_CALCULATOR)),
        )


def _with_split(end: Mapping[str, Mapping[str, int]], split: Split) -> dict[str, dict[str, int]]:
    """``end`` plus how its micro-batch is split (:data:`SPLIT_KEY`), sorted in."""
    merged = {key: dict(value) for key, value in end.items()}
    merged[SPLIT_KEY] = split.encode()
    return dict(sorted(merged.items()))


def _recorded_split(end: Mapping[str, Mapping[str, int]]) -> Split | None:
    """The split an end offset recorded (:func:`_with_split`); None in offsets checkpointed before
    sparkafka recorded it."""
    entry = end.get(SPLIT_KEY)
    return None if entry is None else Split.decode(entry)


def _first_batch_start(end: Mapping[str, Mapping[str, int]]) -> PartitionOffsets | None:
    """The start a first micro-batch's end offset carries (:func:`_with_first_batch_start`), or None."""
    return _entries(end, FIRST_BATCH_START_PREFIX) or None


@dataclass(frozen=True)
class SourceOffset:
    """A source offset as the checkpoint holds it, typed: each partition's next offset and every
    entry of sparkafka's own (``sparkafka:*`` keys), decoded and encoded here only. :meth:`encode`
    writes every entry sorted in, so that equal offsets stay equal JSON for the engine."""

    positions: PartitionOffsets
    heartbeat_ms: int | None = None
    # A new query's first start, not resolved yet (:data:`UNRESOLVED_START`).
    unresolved_start: bool = False
    # Resolved starting offsets (:data:`INITIAL_OFFSET_KEY`): the next batch is the query's first.
    initial: bool = False
    first_batch_start: PartitionOffsets | None = None
    held_starts: PartitionOffsets = field(default_factory=dict)
    leader_epochs: dict[TopicPartitionKey, int] = field(default_factory=dict)
    topic_ids: dict[str, tuple[int, int]] = field(default_factory=dict)
    split: Split | None = None

    @classmethod
    def decode(cls, encoded: Mapping[str, Mapping[str, int]]) -> SourceOffset:
        """Every entry decoded up front: one that does not parse (a hand-edited checkpoint) fails
        the planning before anything is read or committed, naming the offset."""
        try:
            return cls._decode(encoded)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise CheckpointFormatError(
                f"a source offset in the checkpoint does not parse ({type(error).__name__}: {error}): "
                f"{encoded}. sparkafka writes every entry it reads; restore the checkpoint's offsets "
                "log from a backup, or undo the hand edit"
            ) from None

    @classmethod
    def _decode(cls, encoded: Mapping[str, Mapping[str, int]]) -> SourceOffset:
        return cls(
            positions=decode_offsets(encoded),
            heartbeat_ms=heartbeat_of(encoded),
            unresolved_start=encoded.get(UNRESOLVED_START_KEY) is not None,
            initial=INITIAL_OFFSET_KEY in encoded,
            first_batch_start=_first_batch_start(encoded),
            held_starts=_held_starts(encoded),
            leader_epochs=_leader_epochs(encoded),
            topic_ids=_topic_ids(encoded),
            split=_recorded_split(encoded),
        )

    def encode(self) -> dict[str, dict[str, int]]:
        if self.unresolved_start:
            return {key: dict(value) for key, value in UNRESOLVED_START.items()}
        encoded = encode_offsets(self.positions, heartbeat_ms=self.heartbeat_ms)
        if self.initial:
            encoded = _marked_initial(encoded)
        if self.first_batch_start is not None:
            encoded = _with_first_batch_start(encoded, self.first_batch_start)
        if self.held_starts:
            encoded = _with_held_starts(encoded, self.held_starts)
        if self.leader_epochs:
            encoded = _with_leader_epochs(encoded, self.leader_epochs)
        if self.topic_ids:
            encoded = _with_topic_ids(encoded, self.topic_ids)
        if self.split is not None:
            encoded = _with_split(encoded, self.split)
        return encoded
