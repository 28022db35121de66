"""The source's options, as Spark's Kafka source names them: parsed and checked once on the driver."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sparkafka.connector.kafka_admin import (
    EAGER_CONNECTIONS,
    LIBRDKAFKA_LOGGER,
    KafkaAdmin,
    TopicPartitionKey,
)
from sparkafka.connector.options import (
    OptionReader,
    OptionSpec,
    parse_choice,
    parse_int,
    parse_partition_numbers,
    parse_topic_partitions,
    reject_forbidden_kafka_params,
)
from sparkafka.connector.source.offsets import Split
from sparkafka.errors import (
    SparkafkaOptionError,
)

SOURCE_NAME = "sparkafka"

# Spark's spelling of ListOffsets sentinels inside startingOffsets / endingOffsets JSON.
LATEST_SENTINEL = -1
EARLIEST_SENTINEL = -2


SUBSCRIBE = "subscribe"
SUBSCRIBE_PATTERN = "subscribePattern"
ASSIGN = "assign"
STRATEGY_OPTIONS = (ASSIGN, SUBSCRIBE, SUBSCRIBE_PATTERN)

STARTING_OFFSETS = "startingOffsets"
STARTING_OFFSETS_BY_TIMESTAMP = "startingOffsetsByTimestamp"
STARTING_TIMESTAMP = "startingTimestamp"
STARTING_TIMESTAMP_STRATEGY = "startingOffsetsByTimestampStrategy"
ENDING_OFFSETS = "endingOffsets"
ENDING_OFFSETS_BY_TIMESTAMP = "endingOffsetsByTimestamp"
ENDING_TIMESTAMP = "endingTimestamp"

SOURCE_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(SUBSCRIBE, "comma-separated topics"),
    OptionSpec(SUBSCRIBE_PATTERN, "regular expression matching whole topic names"),
    OptionSpec(ASSIGN, 'JSON {"topic":[partitions]}'),
    OptionSpec(STARTING_OFFSETS, "earliest, latest, group or JSON offsets"),
    OptionSpec(STARTING_OFFSETS_BY_TIMESTAMP, 'JSON {"topic":{"partition":timestamp ms}}'),
    OptionSpec(STARTING_TIMESTAMP, "timestamp in ms for every partition"),
    OptionSpec(STARTING_TIMESTAMP_STRATEGY, "error or latest, when no record has the timestamp"),
    OptionSpec(ENDING_OFFSETS, "batch only: latest or JSON offsets"),
    OptionSpec(ENDING_OFFSETS_BY_TIMESTAMP, "batch only"),
    OptionSpec(ENDING_TIMESTAMP, "batch only"),
    OptionSpec("failOnDataLoss", "true or false"),
    OptionSpec("includeHeaders", "true or false"),
    OptionSpec("maxOffsetsPerTrigger", "streaming: upper bound of records per micro-batch"),
    OptionSpec("minOffsetsPerTrigger", "streaming: wait for this many new records"),
    OptionSpec("maxTriggerDelay", "streaming: longest wait for minOffsetsPerTrigger"),
    OptionSpec("minPartitions", "split offset ranges into about this many Spark partitions, as Spark does"),
    OptionSpec("maxRecordsPerPartition", "split offset ranges larger than this"),
    OptionSpec("groupIdPrefix", "prefix of the generated consumer group id"),
    OptionSpec("groupOffsetsFallback", "earliest, latest or none for startingOffsets=group"),
    OptionSpec("commitOffsetsOnBatch", "publish processed offsets to kafka.group.id for monitoring"),
    OptionSpec("partitionDiscoveryIntervalMs", "how often new partitions and topics are looked for"),
    OptionSpec("idleHeartbeatIntervalMs", "streaming: a heartbeat row after the input was idle this long"),
    OptionSpec("kafkaConsumer.pollTimeoutMs", "longest time a read may make no progress"),
    OptionSpec("fetchOffset.numRetries", "attempts of a failed offset request"),
    OptionSpec("fetchOffset.retryIntervalMs", "wait between those attempts"),
)

# Kafka client properties the source controls itself (Spark's KafkaSourceProvider list and wording).
FORBIDDEN_KAFKA_PARAMS: Mapping[str, str] = {
    "auto.offset.reset": (
        "Instead set the source option 'startingOffsets' to 'earliest', 'latest' or 'group' to specify "
        "where to start. The source manages which offsets are consumed itself (they are kept in Spark's "
        "checkpoint), rather than relying on the Kafka consumer to do it; 'startingOffsets' only applies "
        "when a new streaming query is started, and resuming always picks up from where the query left off."
    ),
    "enable.auto.commit": (
        "Offsets are kept in Spark's checkpoint. To publish progress to a consumer group for lag "
        "monitoring, set 'kafka.group.id' and keep 'commitOffsetsOnBatch' (default true)."
    ),
    "key.deserializer": (
        "Keys are always returned as bytes (a binary column). Use DataFrame operations to explicitly "
        "deserialize the keys."
    ),
    "value.deserializer": (
        "Values are always returned as bytes (a binary column). Use DataFrame operations to explicitly "
        "deserialize the values."
    ),
    "interceptor.classes": "Interceptors can modify the payload, so they are not safe.",
}

DEFAULT_API_TIMEOUT = "30000"
DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_MAX_TRIGGER_DELAY = "15m"
ARROW_BATCH_ROWS = 10_000
PREFETCH_RECORDS = 2 * ARROW_BATCH_ROWS  # per partition, see executor_consumer_config
PREFETCH_RECHECK_MS = 10
TRAILING_FETCH_WAIT_MS = 50  # see executor_consumer_config

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


# Names this process's executor consumers (which never join their group) apart from other processes'.
_PROCESS_ID = uuid.uuid4()


@dataclass(frozen=True)
class Subscribe:
    topics: tuple[str, ...]


@dataclass(frozen=True)
class SubscribePattern:
    pattern: str


@dataclass(frozen=True)
class Assign:
    partitions: tuple[TopicPartitionKey, ...]


Strategy = Subscribe | SubscribePattern | Assign

BoundaryKind = Literal["earliest", "latest", "group", "offsets", "timestamps", "timestamp"]


@dataclass(frozen=True)
class OffsetBoundary:
    """Where a range starts or ends, as the user specified it (resolved against the cluster later).

    ``offsets`` holds per-partition offsets (``kind="offsets"``, with -2 earliest and -1 latest) or
    per-partition timestamps (``kind="timestamps"``); ``timestamp`` the single ``*Timestamp`` value."""

    kind: BoundaryKind
    option: str
    offsets: Mapping[TopicPartitionKey, int] = field(default_factory=dict)
    timestamp: int | None = None


EARLIEST = OffsetBoundary("earliest", STARTING_OFFSETS)
LATEST = OffsetBoundary("latest", STARTING_OFFSETS)


@dataclass(frozen=True)
class SourceOptions:
    """Every option of the source, parsed and validated. Picklable: it travels to the executors."""

    client_config: Mapping[str, str]
    strategy: Strategy
    starting: OffsetBoundary | None
    ending: OffsetBoundary | None
    timestamp_strategy: str
    fail_on_data_loss: bool
    include_headers: bool
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    min_partitions: int | None
    max_records_per_partition: int | None
    group_id: str | None
    group_id_prefix: str | None
    group_offsets_fallback: str
    commit_offsets_on_batch: bool
    partition_discovery_interval_ms: int | None  # None: every micro-batch
    api_timeout_ms: int
    poll_timeout_ms: int
    fetch_offset_attempts: int
    fetch_offset_retry_interval_ms: int
    read_committed: bool
    # None: no heartbeats (the default).
    idle_heartbeat_interval_ms: int | None = None

    @property
    def bootstrap_servers(self) -> str:
        return self.client_config["bootstrap.servers"]

    @property
    def split(self) -> Split:
        return Split(self.min_partitions, self.max_records_per_partition)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate the options common to streaming and batch reads (Spark's validateGeneralOptions)."""
        reader = OptionReader(options, SOURCE_OPTIONS, component="source")
        kafka_params, api_timeout_ms = _consumer_params(reader)
        isolation = kafka_params["isolation.level"]
        group_id = kafka_params.get("group.id")
        strategy = _parse_strategy(reader)
        min_offsets, max_offsets = _offsets_per_trigger(reader)
        starting = _parse_boundary(
            reader, STARTING_TIMESTAMP, STARTING_OFFSETS_BY_TIMESTAMP, STARTING_OFFSETS
        )
        if starting is not None and starting.kind == "group" and not group_id:
            raise SparkafkaOptionError(
                "startingOffsets=group resumes from the committed offsets of a consumer group: "
                "set the option 'kafka.group.id' to name it"
            )
        return cls(
            client_config=kafka_params,
            strategy=strategy,
            starting=starting,
            ending=_parse_boundary(reader, ENDING_TIMESTAMP, ENDING_OFFSETS_BY_TIMESTAMP, ENDING_OFFSETS),
            timestamp_strategy=reader.choice(STARTING_TIMESTAMP_STRATEGY, ("error", "latest"), "error"),
            fail_on_data_loss=reader.boolean("failOnDataLoss", True),
            include_headers=reader.boolean("includeHeaders", False),
            max_offsets_per_trigger=max_offsets,
            min_offsets_per_trigger=min_offsets,
            max_trigger_delay_ms=reader.duration_ms("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY),
            min_partitions=reader.optional_integer("minPartitions", minimum=1),
            max_records_per_partition=reader.optional_integer("maxRecordsPerPartition", minimum=1),
            group_id=group_id,
            group_id_prefix=reader.string("groupIdPrefix"),
            group_offsets_fallback=reader.choice(
                "groupOffsetsFallback", ("earliest", "latest", "none"), "latest"
            ),
            commit_offsets_on_batch=reader.boolean("commitOffsetsOnBatch", True),
            partition_discovery_interval_ms=reader.optional_integer("partitionDiscoveryIntervalMs"),
            api_timeout_ms=api_timeout_ms,
            poll_timeout_ms=reader.integer("kafkaConsumer.pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS, minimum=1),
            fetch_offset_attempts=reader.integer("fetchOffset.numRetries", 3, minimum=1),
            fetch_offset_retry_interval_ms=reader.integer("fetchOffset.retryIntervalMs", 1000, minimum=0),
            read_committed=isolation == "read_committed",
            idle_heartbeat_interval_ms=reader.optional_integer("idleHeartbeatIntervalMs", minimum=1),
        )

    def for_stream(self) -> SourceOptions:
        """Streaming queries start at ``latest`` by default and have no end."""
        if self.ending is not None:
            raise SparkafkaOptionError(
                f"option '{self.ending.option}' is not valid in streaming queries: a stream has no end "
                "(use Trigger.AvailableNow to stop at the offsets available when the query starts)"
            )
        return self

    def for_batch(self) -> SourceOptions:
        """Batch reads default to ``[earliest, latest)``; latest cannot start and earliest cannot end."""
        starting = self.starting or EARLIEST
        ending = self.ending or OffsetBoundary("latest", ENDING_OFFSETS)
        if starting.kind == "latest":
            raise SparkafkaOptionError("starting offset can't be latest for batch queries on Kafka")
        if ending.kind == "earliest":
            raise SparkafkaOptionError("ending offset can't be earliest for batch queries on Kafka")
        if starting.kind == "offsets":
            for (topic, partition), offset in sorted(starting.offsets.items()):
                if offset == LATEST_SENTINEL:
                    raise SparkafkaOptionError(
                        f"startingOffsets for {topic}-{partition} can't be latest for batch queries on Kafka"
                    )
        if ending.kind == "offsets":
            for (topic, partition), offset in sorted(ending.offsets.items()):
                if offset == EARLIEST_SENTINEL:
                    raise SparkafkaOptionError(
                        f"ending offset for {topic}-{partition} can't be earliest for batch queries on Kafka"
                    )
        if starting.kind == ending.kind and starting.kind in ("offsets", "timestamps"):
            if set(starting.offsets) != set(ending.offsets):
                raise SparkafkaOptionError(
                    f"{starting.option} and {ending.option} must name the same topic partitions: "
                    f"{_format_partitions(starting.offsets)} vs {_format_partitions(ending.offsets)}"
                )
            for tp, start in sorted(starting.offsets.items()):
                end = ending.offsets[tp]
                if start >= 0 and end >= 0 and start > end:
                    raise SparkafkaOptionError(
                        f"{starting.option} for {tp[0]}-{tp[1]} ({start}) is greater than "
                        f"{ending.option} ({end})"
                    )
        return replace(self, starting=starting, ending=ending)

    def executor_consumer_config(self) -> dict[str, Any]:
        """librdkafka settings of the consumers reading offset ranges on executors.

        They never join a group and never commit: ``assign`` at the range start, read to the range
        end. ``auto.offset.reset=error`` turns an offset removed by retention into an error event
        instead of a silent jump, and partition EOF events mark the end of a partition.

        Connections to all brokers open right away (``EAGER_CONNECTIONS``): with librdkafka's sparse
        connections a fresh consumer's first offset query to the leader now and then waited for a
        500 ms retry timer. The consumers are pooled per Python process
        (:mod:`sparkafka.connector.client_pool`), so the group id is the same for every read of this
        process.

        Prefetch is bounded to two Arrow batches: librdkafka's default keeps 100,000 records per
        partition queued, fetched (and parsed) past the end of a range only to be dropped when the
        read ends, and once that queue is full it stops fetching for a whole second
        (``fetch.queue.backoff.ms``), which a reader faster than the network then waits out. With
        the queue held at 20,000 records and re-checked every 10 ms, reading 50,000 records of a
        longer partition took a third less CPU, and 1,000,000 records a quarter of the time.

        A fetch waits at most 50 ms for records that are not there yet (``fetch.wait.max.ms``,
        librdkafka's default 500 ms). A range never needs to wait for one: its end is at most the
        last stable offset when the range is planned. But a read that ends at the end of its
        partition leaves the fetch past that end waiting at the broker, and a broker answers a
        connection's requests in order: the next read on the same pooled consumer, of any
        partition led by that broker, waited for it, up to 500 ms at the start of every
        micro-batch of a pipeline keeping up with its input."""
        prefix = self.group_id_prefix or "sparkafka-source"
        return {
            **EAGER_CONNECTIONS,
            "queued.min.messages": PREFETCH_RECORDS,
            "fetch.queue.backoff.ms": PREFETCH_RECHECK_MS,
            "fetch.wait.max.ms": TRAILING_FETCH_WAIT_MS,
            **self.client_config,
            "group.id": self.group_id or f"{prefix}-{_PROCESS_ID}-executor",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "logger": LIBRDKAFKA_LOGGER,
        }

    def admin(self) -> KafkaAdmin:
        return KafkaAdmin(
            self.client_config,
            timeout_s=self.api_timeout_ms / 1000,
            attempts=self.fetch_offset_attempts,
            retry_interval_s=self.fetch_offset_retry_interval_ms / 1000,
        )


def _consumer_params(reader: OptionReader) -> tuple[dict[str, str], int]:
    """The ``kafka.*`` options as the consumers' configuration, checked (bootstrap servers given,
    none of the properties the source sets itself, a known isolation level), and the API timeout,
    which the connector reads itself and takes out."""
    kafka_params = reader.kafka_params()
    reject_forbidden_kafka_params(kafka_params, FORBIDDEN_KAFKA_PARAMS)
    if not kafka_params.get("bootstrap.servers", "").strip():
        raise SparkafkaOptionError(
            "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka consumer"
        )
    api_timeout_ms = parse_int(
        "kafka.default.api.timeout.ms",
        kafka_params.pop("default.api.timeout.ms", DEFAULT_API_TIMEOUT),
        minimum=1,
    )
    kafka_params["isolation.level"] = parse_choice(
        "kafka.isolation.level", kafka_params.get("isolation.level", "read_committed"), ISOLATION_LEVELS
    )
    return kafka_params, api_timeout_ms


def _offsets_per_trigger(reader: OptionReader) -> tuple[int | None, int | None]:
    """minOffsetsPerTrigger and maxOffsetsPerTrigger, the minimum no higher than the maximum."""
    min_offsets = reader.optional_integer("minOffsetsPerTrigger", minimum=1)
    max_offsets = reader.optional_integer("maxOffsetsPerTrigger", minimum=1)
    if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
        raise SparkafkaOptionError(
            f"The value of minOffsetsPerTrigger({min_offsets}) is higher than the "
            f"maxOffsetsPerTrigger({max_offsets})."
        )
    return min_offsets, max_offsets


def _parse_strategy(reader: OptionReader) -> Strategy:
    given = [name for name in STRATEGY_OPTIONS if reader.has(name)]
    if not given:
        raise SparkafkaOptionError(
            "One of the following options must be specified for Kafka source: "
            f"{', '.join(STRATEGY_OPTIONS)}. See the docs for more details."
        )
    if len(given) > 1:
        raise SparkafkaOptionError(
            "Only one of the following options can be specified for Kafka source: "
            f"{', '.join(STRATEGY_OPTIONS)} (got {', '.join(given)}). See the docs for more details."
        )
    name = given[0]
    value = reader.raw(name) or ""
    if name == SUBSCRIBE:
        topics = tuple(sorted({topic.strip() for topic in value.split(",") if topic.strip()}))
        if not topics:
            raise SparkafkaOptionError(
                f"No topics to subscribe to as specified value for option 'subscribe' is '{value}'"
            )
        return Subscribe(topics)
    if name == SUBSCRIBE_PATTERN:
        pattern = value.strip()
        if not pattern:
            raise SparkafkaOptionError(
                f"Pattern to subscribe is empty as specified value for option 'subscribePattern' is '{value}'"
            )
        try:
            re.compile(pattern)
        except re.error as error:
            raise SparkafkaOptionError(
                f"option 'subscribePattern' is not a valid regular expression ({error}): '{pattern}'"
            ) from None
        return SubscribePattern(pattern)
    return Assign(tuple(parse_topic_partitions(ASSIGN, value)))


def _parse_boundary(
    reader: OptionReader, timestamp_option: str, by_timestamp_option: str, offsets_option: str
) -> OffsetBoundary | None:
    """Spark's preference order: one timestamp for all partitions, then per-partition timestamps,
    then earliest / latest / group / per-partition offsets."""
    timestamp = reader.string(timestamp_option)
    if timestamp is not None:
        try:
            return OffsetBoundary("timestamp", timestamp_option, timestamp=int(timestamp))
        except ValueError:
            raise SparkafkaOptionError(
                f"option '{timestamp_option}': expected a single long value (ms since the epoch), "
                f"got '{timestamp}'"
            ) from None
    by_timestamp = reader.string(by_timestamp_option)
    if by_timestamp is not None:
        timestamps = parse_partition_numbers(by_timestamp_option, by_timestamp)
        return OffsetBoundary("timestamps", by_timestamp_option, offsets=timestamps)
    value = reader.string(offsets_option)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("earliest", "latest"):
        return OffsetBoundary("earliest" if lowered == "earliest" else "latest", offsets_option)
    if lowered == "group" and offsets_option == STARTING_OFFSETS:
        return OffsetBoundary("group", offsets_option)
    if not value.startswith("{"):
        allowed = "earliest, latest, group" if offsets_option == STARTING_OFFSETS else "latest"
        raise SparkafkaOptionError(
            f"option '{offsets_option}' must be {allowed} or JSON such as "
            f'{{"topicA":{{"0":23,"1":-1}}}} (-2 = earliest, -1 = latest), got \'{value}\''
        )
    offsets = parse_partition_numbers(offsets_option, value)
    for (topic, partition), offset in sorted(offsets.items()):
        if offset < EARLIEST_SENTINEL:
            raise SparkafkaOptionError(
                f"option '{offsets_option}': offset {offset} for {topic}-{partition} is not an offset "
                "(use -2 for earliest, -1 for latest)"
            )
    return OffsetBoundary("offsets", offsets_option, offsets=offsets)


def _format_partitions(partitions: Mapping[TopicPartitionKey, Any] | Sequence[TopicPartitionKey]) -> str:
    return "[" + ", ".join(f"{topic}-{partition}" for topic, partition in sorted(partitions)) + "]"
