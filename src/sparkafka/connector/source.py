"""The Kafka source: ``spark.readStream.format("sparkafka")`` and ``spark.read.format("sparkafka")``.

A PySpark Python data source on top of confluent-kafka. Options and output schema are those of
Spark's built-in Kafka source (``subscribe``, ``startingOffsets``, ``maxOffsetsPerTrigger`` …), plus
a few from Flink's connector (``startingOffsets=group``, ``commitOffsetsOnBatch``,
``partitionDiscoveryIntervalMs``). It must never import ``sparkafka.broker``: it runs against real
clusters.

Options (names as in Spark's source; keys are case-insensitive)
    ``kafka.bootstrap.servers``          required. Every ``kafka.*`` option goes to librdkafka without
                                         the prefix (``kafka.security.protocol``, ``kafka.sasl.*``,
                                         ``kafka.ssl.*``, ``kafka.client.rack`` …), except those below.
    ``kafka.isolation.level``            ``read_committed`` (default, unlike Spark) or ``read_uncommitted``.
    ``kafka.group.id``                   group for ``startingOffsets=group`` and ``commitOffsetsOnBatch``;
                                         the source never joins it (it assigns partitions itself).
    ``kafka.default.api.timeout.ms``     bound on every driver-side request (default 30000); not passed
                                         to librdkafka.
    ``subscribe`` | ``subscribePattern`` | ``assign``   exactly one; a pattern selects every topic whose
                                         name it matches anywhere (as Spark's ``findFirstIn``).
    ``startingOffsets``                  ``earliest``, ``latest`` (streaming default), ``group``, or
                                         JSON ``{"t":{"0":23,"1":-2}}`` (-2 earliest, -1 latest);
                                         ``startingOffsetsByTimestamp`` / ``startingTimestamp`` (with
                                         ``startingOffsetsByTimestampStrategy`` error|latest) win over it.
    ``groupOffsetsFallback``             where ``startingOffsets=group`` starts partitions the group has
                                         no commit for: ``latest`` (default, like Flink's
                                         setStartFromGroupOffsets with Kafka's default reset),
                                         ``earliest``, or ``none`` (fail).
    ``endingOffsets`` (``endingOffsetsByTimestamp``, ``endingTimestamp``)   batch only; default latest.
    ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger``, ``maxTriggerDelay`` (default 15m)   streaming.
    ``minPartitions``, ``maxRecordsPerPartition``   split large offset ranges into more Spark tasks.
    ``failOnDataLoss`` (default true), ``includeHeaders`` (default false), ``groupIdPrefix``.
    ``commitOffsetsOnBatch``             default true: processed offsets are committed to
                                         ``kafka.group.id`` (when set) so lag tools see progress.
                                         Monitoring only: recovery always uses the checkpoint.
    ``partitionDiscoveryIntervalMs``     how often new partitions of subscribed topics and new
                                         topics matching ``subscribePattern`` are looked for; they are
                                         read from their earliest offset. Default: every micro-batch,
                                         as Spark's source; > 0: at most that often; <= 0: never.
    ``idleHeartbeatIntervalMs``          streaming, default off: once no partition has had new records
                                         for this long, one micro-batch per interval carries a synthetic
                                         heartbeat row, so event-time windows close while the input is
                                         idle (see "Idle heartbeats" below and ``sparkafka.eventtime``).
    ``kafkaConsumer.pollTimeoutMs`` (default 120000), ``fetchOffset.numRetries`` (3),
    ``fetchOffset.retryIntervalMs`` (1000)   as in Spark.

Offsets
    A source offset is ``{"topic": {"partition": next offset to read}}``, Spark's format, with
    topics and partitions always in sorted order so that equal offsets serialise to equal JSON
    (the engine compares offsets as JSON text to decide whether there is new data).

Starting offsets
    The engine keeps every micro-batch's end offsets in the checkpoint, but not a new query's start:
    it asks ``initialOffset()`` when it plans the first micro-batch and asks again when it replays
    that batch after a failure. Spark's own Kafka source writes its starting offsets to a log of its
    own in the checkpoint; a Python data source has no access to the checkpoint. Starting offsets
    that resolve the same every time (``earliest``, numbers, -2; retention aside) are resolved
    again, and marked ``{"sparkafka:initialOffset": {"0": 0}}``; the first micro-batch's end offset
    then also carries its start, ``{"sparkafka:firstBatchStart:<topic>": {"partition": offset}}``,
    checkpointed with it, and ``partitions`` plans from that start: a replay reads the same range
    even after retention moved ``earliest``, and reports the lost records as data loss. For the
    others (``latest`` or -1, ``group``, timestamps) ``initialOffset()`` is a constant,
    ``{"sparkafka:startingOffsets": {"0": 0}}``, and the first ``latestOffset`` call resolves
    ``startingOffsets`` and returns the result (marked too) as the end of micro-batch 0, which reads
    no records;
    the engine checkpoints it like every end offset. Every batch that reads records then starts from
    the same offsets when replayed, even with ``startingOffsets=latest``, which would otherwise move
    between the first run and the replay. (With ``latest`` Spark's engine ran an empty first batch
    anyway, unless records arrived while it planned it.)

Exactly-once reading rests on three invariants:

1. ``partitions(start, end)`` depends on nothing but ``start`` and ``end``: a micro-batch replayed
   after a failure plans the same offset ranges.
2. ``read()`` of range ``[start, end)`` returns exactly the records of that range visible at the
   configured isolation level, however often it runs (unless retention removed them: data loss).
3. End offsets never pass the last stable offset (``read_committed``, the default) so a range never
   covers records of a transaction that is still open and might later abort.

Idle heartbeats (``idleHeartbeatIntervalMs``)
    Spark's watermark only moves when rows arrive, so once the whole input is idle the last
    event-time window of an append-mode query never closes. With the option set, ``latestOffset``
    adds a synthetic entry ``{"sparkafka:idleHeartbeat": {"0": <wall-clock ms>}}`` to the end
    offsets when the input has been idle for the interval. ``:`` cannot occur in a Kafka topic name,
    so the key never collides with a topic. The time is part of the checkpointed offsets: a replayed
    batch plans and emits exactly the same heartbeat (invariant 1 holds). ``partitions(start, end)``
    turns an entry that grew between ``start`` and ``end`` into one :class:`HeartbeatPartition`,
    whose ``read()`` yields one row: key and value null, topic ``""``, partition -1, offset -1,
    timestamp = the heartbeat time (not shifted), timestampType -1 (not a Kafka timestamp). Queries
    drop it after ``withWatermark`` with :func:`sparkafka.connector.eventtime.drop_heartbeats`.

    Invariants: a heartbeat is only planned when the micro-batch would otherwise not run (no
    partition has unread offsets, none was added, reset or lost), so heartbeat batches carry no
    records and never count in rate limits; none while an open transaction holds a partition's last
    stable offset back (its records may carry older timestamps); none under Trigger.AvailableNow.
    Heartbeat times only increase. Every function that treats offset keys as topics
    (:func:`decode_offsets`, hence data-loss checks, partition discovery, rate limits and
    ``commitOffsetsOnBatch``) never sees the entry; ``latestOffset`` carries it forward unchanged
    from ``start`` until the next heartbeat replaces it.
"""

from __future__ import annotations

import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sparkafka.connector.client_pool import CONSUMERS
from sparkafka.connector.kafka_admin import (
    LIBRDKAFKA_LOGGER,
    KafkaAdmin,
    PartitionOffsets,
    TopicPartitionKey,
    partition_watermarks,
    validate_consumer_config,
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
from sparkafka.errors import (
    DataLossError,
    KafkaReadError,
    KafkaUnavailableError,
    SparkafkaOptionError,
    TopicNotFoundError,
)

logger = logging.getLogger(__name__)

SOURCE_NAME = "sparkafka"

# Spark's spelling of ListOffsets sentinels inside startingOffsets / endingOffsets JSON.
LATEST_SENTINEL = -1
EARLIEST_SENTINEL = -2

# -- options ----------------------------------------------------------------------------------------

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
ENDING_OPTIONS = (ENDING_OFFSETS, ENDING_OFFSETS_BY_TIMESTAMP, ENDING_TIMESTAMP)

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
    OptionSpec("minPartitions", "split offset ranges into at least this many Spark partitions"),
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
        kafka_params = reader.kafka_params()
        reject_forbidden_kafka_params(kafka_params, FORBIDDEN_KAFKA_PARAMS)
        if not kafka_params.get("bootstrap.servers", "").strip():
            raise SparkafkaOptionError(
                "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka consumer"
            )
        strategy = _parse_strategy(reader)
        # Read by the connector (bounded waits on the driver), not a librdkafka property.
        api_timeout_ms = parse_int(
            "kafka.default.api.timeout.ms",
            kafka_params.pop("default.api.timeout.ms", DEFAULT_API_TIMEOUT),
            minimum=1,
        )
        isolation = parse_choice(
            "kafka.isolation.level", kafka_params.get("isolation.level", "read_committed"), ISOLATION_LEVELS
        )
        kafka_params["isolation.level"] = isolation
        group_id = kafka_params.get("group.id")

        min_offsets = reader.optional_integer("minOffsetsPerTrigger", minimum=1)
        max_offsets = reader.optional_integer("maxOffsetsPerTrigger", minimum=1)
        if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
            raise SparkafkaOptionError(
                f"The value of minOffsetsPerTrigger({min_offsets}) is higher than the "
                f"maxOffsetsPerTrigger({max_offsets})."
            )
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

        Connections to all brokers open right away: with librdkafka's sparse connections a fresh
        consumer's first offset query to the leader now and then waited for a 500 ms retry timer.
        The consumers are pooled per Python process (:mod:`sparkafka.connector.client_pool`), so the group id
        is the same for every read of this process.

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
            "enable.sparse.connections": False,
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


# -- schema -----------------------------------------------------------------------------------------


def kafka_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema (KafkaRecordToRowConverter.kafkaSchema)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def kafka_arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema PySpark expects for :func:`kafka_schema` (TimestampType is UTC microseconds)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(pa.field("element", header))))
    return pa.schema(fields)


# -- offsets ----------------------------------------------------------------------------------------


# The idle heartbeat's entry in a source offset: {HEARTBEAT_OFFSET_KEY: {HEARTBEAT_SLOT: time in ms}}.
# ':' is not allowed in Kafka topic names, so no topic can ever be mistaken for it (or vice versa).
HEARTBEAT_OFFSET_KEY = "sparkafka:idleHeartbeat"
HEARTBEAT_SLOT = "0"
# A new query's initial offset: "the starting offsets, not resolved yet" (see "Starting offsets" in
# the module docstring). The same constant whenever and however often the engine asks.
UNRESOLVED_START_KEY = "sparkafka:startingOffsets"
UNRESOLVED_START: dict[str, dict[str, int]] = {UNRESOLVED_START_KEY: {"0": 0}}
# A resolved initial offset (earliest, numbers, -2) carries this entry, so that latestOffset knows it
# plans the first micro-batch ...
INITIAL_OFFSET_KEY = "sparkafka:initialOffset"
# ... whose end offset then carries that batch's start, {FIRST_BATCH_START_PREFIX + topic:
# {partition: offset}}, checkpointed with it (see "Starting offsets" in the module docstring).
FIRST_BATCH_START_PREFIX = "sparkafka:firstBatchStart:"
# Starting offsets an open transaction still holds back when a micro-batch runs for other partitions:
# {HELD_START_PREFIX + topic: {partition: offset}} in its end offset.
HELD_START_PREFIX = "sparkafka:heldStart:"
# How a micro-batch's offset ranges are split into input partitions, recorded in its end offset so
# that a replay splits them as the first run did: {SPLIT_KEY: {"minPartitions": n,
# "maxRecordsPerPartition": n}}, 0 where the option is not set.
SPLIT_KEY = "sparkafka:split"
# Offset entries of sparkafka's own: never a topic (':' cannot occur in a topic name).
_OWN_ENTRY_PREFIX = "sparkafka:"
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


def decode_offsets(encoded: Mapping[str, Mapping[str, int]]) -> PartitionOffsets:
    """Spark's offset JSON -> ``{(topic, partition): offset}``: real topic partitions only, the idle
    heartbeat entry (read it with :func:`heartbeat_of`) and the unresolved start are left out."""
    return {
        (topic, int(partition)): int(offset)
        for topic, by_partition in encoded.items()
        if not topic.startswith(_OWN_ENTRY_PREFIX)
        for partition, offset in by_partition.items()
    }


def with_first_batch_start(
    end: Mapping[str, Mapping[str, int]], start: Mapping[TopicPartitionKey, int]
) -> dict[str, dict[str, int]]:
    """``end`` plus the first micro-batch's ``start`` in entries of its own, sorted in."""
    return _with_entries(end, FIRST_BATCH_START_PREFIX, start)


def with_held_starts(
    end: Mapping[str, Mapping[str, int]], held: Mapping[TopicPartitionKey, int]
) -> dict[str, dict[str, int]]:
    """``end`` plus the starting offsets an open transaction still holds back, in entries of their
    own, so that the next micro-batch keeps holding them rather than take them for data loss."""
    return _with_entries(end, HELD_START_PREFIX, held)


def held_starts(encoded: Mapping[str, Mapping[str, int]]) -> PartitionOffsets:
    """The held starting offsets an offset carries (:func:`with_held_starts`)."""
    return _entries(encoded, HELD_START_PREFIX)


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

    def encode(self) -> dict[str, int]:
        return {
            "maxRecordsPerPartition": self.max_records_per_partition or 0,
            "minPartitions": self.min_partitions or 0,
        }

    @classmethod
    def decode(cls, entry: Mapping[str, int]) -> Split:
        return cls(
            min_partitions=int(entry.get("minPartitions", 0)) or None,
            max_records_per_partition=int(entry.get("maxRecordsPerPartition", 0)) or None,
        )


def with_split(end: Mapping[str, Mapping[str, int]], split: Split) -> dict[str, dict[str, int]]:
    """``end`` plus how its micro-batch is split (:data:`SPLIT_KEY`), sorted in."""
    merged = {key: dict(value) for key, value in end.items()}
    merged[SPLIT_KEY] = split.encode()
    return dict(sorted(merged.items()))


def recorded_split(end: Mapping[str, Mapping[str, int]]) -> Split | None:
    """The split an end offset recorded (:func:`with_split`); None in offsets checkpointed before
    sparkafka recorded it."""
    entry = end.get(SPLIT_KEY)
    return None if entry is None else Split.decode(entry)


def first_batch_start(end: Mapping[str, Mapping[str, int]]) -> PartitionOffsets | None:
    """The start a first micro-batch's end offset carries (:func:`with_first_batch_start`), or None."""
    return _entries(end, FIRST_BATCH_START_PREFIX) or None


def heartbeat_of(encoded: Mapping[str, Mapping[str, int]]) -> int | None:
    """The idle heartbeat time (ms) recorded in a source offset, None if it has none."""
    entry = encoded.get(HEARTBEAT_OFFSET_KEY)
    if not entry or HEARTBEAT_SLOT not in entry:
        return None
    return int(entry[HEARTBEAT_SLOT])


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


# -- discovering partitions and resolving offsets ---------------------------------------------------


class OffsetResolver:
    """Driver-side questions to the cluster, in the terms of the source's options."""

    def __init__(self, options: SourceOptions, admin: KafkaAdmin) -> None:
        self.options = options
        self.admin = admin

    def partitions(self, *, require_topics: bool) -> list[TopicPartitionKey]:
        """The topic partitions the strategy selects right now, sorted.

        With ``require_topics`` a topic named by ``subscribe`` or ``assign`` that does not exist is
        an error (a typo should not silently read nothing); otherwise its partitions are just absent
        and the caller treats them as gone."""
        strategy = self.options.strategy
        if isinstance(strategy, SubscribePattern):
            topics = self.admin.topic_partitions()
            pattern = re.compile(strategy.pattern)
            return sorted(
                (topic, partition)
                for topic, partitions in topics.items()
                if pattern.search(topic)
                for partition in partitions
            )
        # Named topics are asked for by name, as Spark's source does; only a pattern needs them all.
        if isinstance(strategy, Subscribe):
            wanted_topics: Sequence[str] = strategy.topics
            topics = self.admin.topic_partitions(wanted_topics)
            if require_topics:
                self._require_topics(wanted_topics, topics, SUBSCRIBE)
            return sorted(
                (topic, partition) for topic in wanted_topics for partition in topics.get(topic, ())
            )
        wanted = strategy.partitions
        topics = self.admin.topic_partitions({topic for topic, _ in wanted})
        if require_topics:
            self._require_topics(sorted({topic for topic, _ in wanted}), topics, ASSIGN)
            missing = [(t, p) for t, p in wanted if p not in topics[t]]
            if missing:
                raise TopicNotFoundError(
                    f"option 'assign' names partitions that do not exist: {_format_partitions(missing)} "
                    f"(topic '{missing[0][0]}' has {len(topics[missing[0][0]])} partitions)"
                )
        return sorted(tp for tp in wanted if tp[1] in topics.get(tp[0], ()))

    def _require_topics(self, wanted: Sequence[str], existing: Mapping[str, list[int]], option: str) -> None:
        missing = [topic for topic in wanted if topic not in existing]
        if missing:
            names = ", ".join(f"'{topic}'" for topic in missing)
            raise TopicNotFoundError(
                f"topic {names} named by option '{option}' does not exist on the Kafka cluster at "
                f"'{self.options.bootstrap_servers}'" + ("" if len(missing) == 1 else " (none of them do)")
            )

    def latest(self, partitions: Sequence[TopicPartitionKey]) -> PartitionOffsets:
        return self.admin.latest_offsets(partitions, read_committed=self.options.read_committed)

    def high_watermarks(self, partitions: Sequence[TopicPartitionKey]) -> PartitionOffsets:
        """End offsets past any open transaction, whatever the isolation level: what :meth:`latest`
        gives with read_committed falls short of them while a transaction is open."""
        return self.admin.latest_offsets(partitions, read_committed=False)

    def resolve(
        self,
        boundary: OffsetBoundary,
        partitions: Sequence[TopicPartitionKey],
        *,
        starting: bool,
        latest_snapshot: Mapping[TopicPartitionKey, int] | None = None,
    ) -> PartitionOffsets:
        """Concrete offsets for every partition in ``partitions``.

        Steps: ask the cluster for what the boundary refers to (log start, last stable offset,
        group commits, offsets of timestamps); fill sentinels (-2/-1) and fallbacks; check that
        explicitly requested offsets still exist and are not past the end (data loss otherwise)."""
        wanted = list(partitions)
        if boundary.kind in ("offsets", "timestamps"):
            named = set(boundary.offsets)
            if named != set(wanted):
                raise SparkafkaOptionError(
                    f"If {boundary.option} contains specific offsets, you must specify all TopicPartitions.\n"
                    "Use -1 for latest, -2 for earliest.\n"
                    f"Specified: {_format_partitions(list(named))} Assigned: {_format_partitions(wanted)}"
                )

        cache: dict[str, PartitionOffsets] = {}

        def earliest() -> PartitionOffsets:
            if "earliest" not in cache:
                cache["earliest"] = self.admin.earliest_offsets(wanted)
            return cache["earliest"]

        def latest() -> PartitionOffsets:
            if "latest" not in cache:
                cache["latest"] = (
                    dict(latest_snapshot) if latest_snapshot is not None else self.latest(wanted)
                )
            return cache["latest"]

        if boundary.kind == "earliest":
            resolved = earliest()
        elif boundary.kind == "latest":
            resolved = latest()
        elif boundary.kind == "group":
            resolved = self._group_offsets(wanted, earliest, latest)
        elif boundary.kind == "offsets":
            resolved = {}
            for tp, offset in boundary.offsets.items():
                if offset == EARLIEST_SENTINEL:
                    resolved[tp] = earliest()[tp]
                elif offset == LATEST_SENTINEL:
                    resolved[tp] = latest()[tp]
                else:
                    resolved[tp] = self._checked_offset(
                        boundary, tp, offset, earliest()[tp], latest()[tp], starting
                    )
        else:
            timestamps = (
                boundary.offsets
                if boundary.kind == "timestamps"
                else dict.fromkeys(wanted, boundary.timestamp or 0)
            )
            found = self.admin.offsets_for_timestamps(timestamps, read_committed=self.options.read_committed)
            resolved = {}
            for tp in wanted:
                match = found.get(tp)
                if match is not None:
                    resolved[tp] = match
                    continue
                if starting and self.options.timestamp_strategy == "error":
                    raise SparkafkaOptionError(
                        "No offset matched from request of topic-partition "
                        f"{tp[0]}-{tp[1]} and timestamp {timestamps[tp]} ({boundary.option}): "
                        "no record has a timestamp at or after it. "
                        f"Set {STARTING_TIMESTAMP_STRATEGY}=latest to start at the latest offset instead."
                    )
                resolved[tp] = latest()[tp]
        missing = [tp for tp in wanted if tp not in resolved]
        if missing:
            raise TopicNotFoundError(
                f"partitions {_format_partitions(missing)} disappeared while resolving {boundary.option}"
            )
        return {tp: resolved[tp] for tp in wanted}

    def _group_offsets(
        self,
        partitions: list[TopicPartitionKey],
        earliest: Callable[[], PartitionOffsets],
        latest: Callable[[], PartitionOffsets],
    ) -> PartitionOffsets:
        group_id = self.options.group_id
        assert group_id is not None, "validated by SourceOptions.parse"
        # As a read_committed Kafka consumer (KIP-447): offsets an open transaction is about to
        # commit are waited for, so the query does not start before them and read twice.
        committed = self.admin.committed_offsets(
            group_id, partitions, require_stable=self.options.read_committed
        )
        uncommitted = [tp for tp in partitions if tp not in committed]
        fallback = self.options.group_offsets_fallback
        if uncommitted and fallback == "none":
            raise SparkafkaOptionError(
                f"consumer group '{group_id}' has no committed offset for {_format_partitions(uncommitted)} "
                "and groupOffsetsFallback=none; set groupOffsetsFallback to earliest or latest to start "
                "those partitions there"
            )
        if uncommitted:
            logger.info(
                "consumer group %r has no committed offset for %s; starting them at %s",
                group_id,
                _format_partitions(uncommitted),
                fallback,
            )
        resolved = dict(committed)
        for tp in uncommitted:
            resolved[tp] = (earliest() if fallback == "earliest" else latest())[tp]
        log_start = earliest()
        for tp in committed:
            if committed[tp] < log_start[tp]:
                resolved[tp] = report_data_loss(
                    self.options,
                    f"consumer group '{group_id}' committed offset {committed[tp]} for topic '{tp[0]}' "
                    f"partition {tp[1]}, but the earliest available offset is {log_start[tp]}",
                    resume_at=log_start[tp],
                )
        return resolved

    def _checked_offset(
        self,
        boundary: OffsetBoundary,
        tp: TopicPartitionKey,
        offset: int,
        log_start: int,
        log_end: int,
        starting: bool,
    ) -> int:
        if offset > log_end:
            latest = "last stable offset" if self.options.read_committed else "latest offset"
            if not starting:
                raise SparkafkaOptionError(
                    f"{boundary.option} for topic '{tp[0]}' partition {tp[1]} is {offset}, beyond the "
                    f"{latest} {log_end}"
                )
            # As Spark's source, a start past the end is data loss (the log went back), not a
            # mistake in the option; but with read_committed an open transaction can hold the last
            # stable offset below records that exist: the query waits for them there.
            if self.options.read_committed and offset <= self.high_watermarks([tp]).get(tp, -1):
                return offset
            return report_data_loss(
                self.options,
                f"{boundary.option} for topic '{tp[0]}' partition {tp[1]} is {offset}, beyond the {latest} "
                f"{log_end}",
                resume_at=log_end,
            )
        if starting and offset < log_start:
            return report_data_loss(
                self.options,
                f"{boundary.option} for topic '{tp[0]}' partition {tp[1]} was {offset} but the earliest "
                f"available offset is {log_start}",
                resume_at=log_start,
            )
        return offset


DATA_LOSS_CAUSE = (
    "Some data may have been lost because they are not available in Kafka any more; either the data was "
    "aged out by Kafka (retention) or the topic may have been deleted (and recreated) before all the "
    "data in the topic was processed."
)


def report_data_loss(options: SourceOptions, message: str, *, resume_at: int) -> int:
    """Fail (``failOnDataLoss=true``) or warn and return the offset to continue from."""
    if options.fail_on_data_loss:
        raise DataLossError(
            f"{message}. {DATA_LOSS_CAUSE} If you want your streaming query to continue from the earliest "
            'available offset instead of failing, set the source option "failOnDataLoss" to "false".'
        )
    logger.warning("%s. %s Continuing (failOnDataLoss=false).", message, DATA_LOSS_CAUSE)
    return resume_at


# -- streaming --------------------------------------------------------------------------------------


def _resolves_the_same_later(boundary: OffsetBoundary) -> bool:
    """Whether ``boundary`` resolves to the same offsets whenever it is resolved: a partition's
    earliest offset moves only when retention deletes records, which no reader can read anyway."""
    if boundary.kind == "earliest":
        return True
    return boundary.kind == "offsets" and LATEST_SENTINEL not in boundary.offsets.values()


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Lives in one Python process on the driver for the whole query; a copy
    without the admin client is pickled to the executors, where only :meth:`read` runs."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: KafkaAdmin | None = None
        # Spark asks for the initial offset more than once; resolving it twice could differ.
        self._initial: PartitionOffsets | None = None
        # Trigger.AvailableNow: latest offsets when the query started; never read past them.
        self._available_now_target: PartitionOffsets | None = None
        self._known_partitions: list[TopicPartitionKey] | None = None
        self._discovered_at = 0.0
        self._last_trigger_at: float | None = None
        self._latest: PartitionOffsets | None = None
        self._published: PartitionOffsets | None = None
        # Idle heartbeats (monotonic clock): when the input was last seen active, the latest offsets
        # seen then, when the last heartbeat was planned, and whether the idle period was logged.
        self._active_at: float | None = None
        self._latest_when_active: PartitionOffsets | None = None
        self._heartbeat_planned_at: float | None = None
        self._idle_reported = False
        # Partitions whose starting offsets open transactions hold back (logged once per hold).
        self._holding: frozenset[TopicPartitionKey] = frozenset()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_admin"] = None
        return state

    @property
    def resolver(self) -> OffsetResolver:
        if self._admin is None:
            self._admin = self.options.admin()
        return OffsetResolver(self.options, self._admin)

    # -- offsets --

    def initialOffset(self) -> dict[str, dict[str, int]]:
        """The engine asks for this when it plans the first micro-batch and again when it replays
        that batch after a failure (see "Starting offsets" in the module docstring). Starting offsets
        that resolve the same both times (``earliest``, offsets given as numbers or -2) are returned
        resolved, so the first batch reads records as with Spark's source; the others (``latest``,
        -1, ``group``, timestamps, which fall back to latest) as :data:`UNRESOLVED_START`, which
        :meth:`latestOffset` resolves into the end of an empty, checkpointed first batch."""
        if not _resolves_the_same_later(self.options.starting or LATEST):
            return {key: dict(value) for key, value in UNRESOLVED_START.items()}
        return _marked_initial(encode_offsets(self._starting_offsets()))

    def _starting_offsets(self) -> PartitionOffsets:
        """``startingOffsets`` (default latest) resolved against the cluster, once per reader."""
        if self._initial is None:
            partitions = self._partitions(require_topics=True)
            boundary = self.options.starting or LATEST
            self._initial = self.resolver.resolve(
                boundary, partitions, starting=True, latest_snapshot=self._snapshot_for(partitions)
            )
            logger.info("starting offsets: %s", encode_offsets(self._initial))
        return self._initial

    def _snapshot_for(self, partitions: Sequence[TopicPartitionKey]) -> PartitionOffsets | None:
        """Under AvailableNow "latest" means the target recorded at prepare time, not a newer one."""
        target = self._available_now_target
        if target is not None and all(tp in target for tp in partitions):
            return {tp: target[tp] for tp in partitions}
        return None

    def getDefaultReadLimit(self) -> ReadLimit:
        # Python's ReadLimit cannot combine min and max; latestOffset applies both from the options
        # whenever the engine does not ask for everything (ReadAllAvailable).
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        partitions = self._partitions(require_topics=False, force=True)
        self._available_now_target = self.resolver.latest(partitions)
        logger.info("Trigger.AvailableNow reads up to %s", encode_offsets(self._available_now_target))

    def latestOffset(self, start: dict[str, dict[str, int]], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """End offsets of the next micro-batch, or ``start`` itself when there is nothing to do.

        Steps:
        0. From :data:`UNRESOLVED_START` (a new query's first micro-batch): the resolved starting
           offsets, and nothing else; that batch reads no records and fixes the start in the checkpoint.
        1. Publish ``start`` to the consumer group (``commitOffsetsOnBatch``): the engine only asks
           for new offsets once the batch ending at ``start`` is complete.
        2. The partitions to consider: re-discovered every micro-batch (or every
           ``partitionDiscoveryIntervalMs``); under AvailableNow exactly those of the target
           recorded at prepare time.
        3. Latest offsets (the last stable offset with read_committed), capped by the AvailableNow
           target.
        4. Partitions of ``start`` that are gone, or whose latest offset went below the start (topic
           recreated), are data loss: fail, or drop / reset them to their earliest offset. With
           read_committed a start still within the high watermark is only held back by an open
           transaction: such a partition stays where it is.
        5. New partitions enter ``end`` at their earliest offset and are read from the next batch
           on, so that ``partitions(start, end)`` never has to ask the cluster where they begin.
        6. Unless the engine asks for everything: wait for ``minOffsetsPerTrigger`` (at most
           ``maxTriggerDelay``; never under AvailableNow) and cap at ``maxOffsetsPerTrigger``.
        7. Idle heartbeat (``idleHeartbeatIntervalMs``): carry ``start``'s heartbeat entry forward, or
           replace it by a new one when :meth:`_heartbeat_due` says so. Steps 1-6 never see it.
        """
        if start.get(UNRESOLVED_START_KEY) is not None:
            return _marked_initial(encode_offsets(self._starting_offsets()))
        start_offsets = decode_offsets(start)
        self._publish_progress(start_offsets)
        resolver = self.resolver
        target = self._available_now_target
        if target is not None:
            # A partition of start missing from the target appeared between prepare and the initial
            # offsets: it is not gone, it just has nothing to read under AvailableNow.
            partitions = sorted(set(target) | set(start_offsets))
        else:
            partitions = self._partitions(require_topics=False)
        latest = resolver.latest(partitions)
        self._latest = latest
        end: PartitionOffsets = {}

        gone = sorted(tp for tp in start_offsets if tp not in latest)
        if gone:
            report_data_loss(
                self.options,
                f"partitions {_format_partitions(gone)} are gone (topic deleted or no longer selected by the "
                "subscription) with records possibly not yet read",
                resume_at=0,
            )
        reset: list[TopicPartitionKey] = []
        # Starting offsets may wait for an open transaction: all of them while the start is the
        # query's initial one, then those a batch carried forward still unread (held_starts).
        may_hold = (
            set(start_offsets)
            if INITIAL_OFFSET_KEY in start
            else {tp for tp, offset in held_starts(start).items() if start_offsets.get(tp) == offset}
        )
        held_back = self._held_back_by_open_transactions(start_offsets, latest, may_hold)
        for tp, begin in start_offsets.items():
            if tp not in latest:
                continue
            if tp in held_back:
                end[tp] = begin
                continue
            if latest[tp] < begin:
                report_data_loss(
                    self.options,
                    f"topic '{tp[0]}' partition {tp[1]}: the latest offset went back from {begin} to "
                    f"{latest[tp]} (topic deleted and recreated, or the log was truncated)",
                    resume_at=0,
                )
                reset.append(tp)
                continue
            ceiling = target.get(tp, begin) if target is not None else latest[tp]
            end[tp] = max(begin, min(latest[tp], ceiling))

        discovered = [tp for tp in latest if tp not in start_offsets]
        restart_at = resolver.admin.earliest_offsets(discovered + reset) if discovered or reset else {}
        for tp in reset:
            # Empty range this batch (end < start); the next batch reads the new log from its start.
            end[tp] = restart_at.get(tp, 0)
        for tp in discovered:
            if tp not in restart_at:
                continue
            first = restart_at[tp]
            if first != 0:
                first = report_data_loss(
                    self.options,
                    f"added partition {tp[0]}-{tp[1]} starts from offset {first} instead of 0",
                    resume_at=first,
                )
            end[tp] = min(first, target[tp]) if target is not None else first
            logger.info("discovered partition %s-%d; reading it from offset %d", tp[0], tp[1], end[tp])

        if not isinstance(limit, ReadAllAvailable):
            # A changed set of partitions is never delayed: the warnings above would repeat every
            # trigger until the batch runs.
            partitions_changed = bool(gone or reset or discovered)
            end = self._apply_read_limits(start_offsets, end, limit, may_wait=not partitions_changed)
        heartbeat_ms = heartbeat_of(start)
        if self._heartbeat_due(start_offsets, end, latest, partitions):
            heartbeat_ms = next_heartbeat_ms(heartbeat_ms, int(time.time() * 1000))
        encoded = encode_offsets(end, heartbeat_ms=heartbeat_ms)
        if decode_offsets(encoded) == start_offsets and heartbeat_ms == heartbeat_of(start):
            return start  # nothing new: the engine compares the JSON text, own entries included
        if INITIAL_OFFSET_KEY in start:
            encoded = with_first_batch_start(encoded, start_offsets)
        if held_back:
            encoded = with_held_starts(encoded, {tp: start_offsets[tp] for tp in held_back})
        return with_split(encoded, self.options.split)

    def _held_back_by_open_transactions(
        self, start: PartitionOffsets, latest: PartitionOffsets, may_hold: set[TopicPartitionKey]
    ) -> set[TopicPartitionKey]:
        """Partitions of the query's starting offsets (``start`` is marked as such) past their last
        stable offset but not past their high watermark.

        With read_committed the latest offset is the last stable offset, which an open transaction
        holds below records already written. A starting offset there (a group's offsets committed by
        a read_uncommitted consumer, explicit offsets) is not data loss: those partitions wait until
        the transaction ends. Any later start was reached by this query reading read_committed, and
        the last stable offset never moves back: below it, the log went back (topic recreated, log
        truncated), even if a new open transaction has written past the start since."""
        below_start = [
            tp for tp, begin in start.items() if tp in may_hold and tp in latest and latest[tp] < begin
        ]
        if not below_start or not self.options.read_committed:
            self._holding = frozenset()
            return set()
        high_watermarks = self.resolver.high_watermarks(below_start)
        held = frozenset(tp for tp in below_start if high_watermarks.get(tp, -1) >= start[tp])
        if held and held != self._holding:
            logger.info(
                "open transactions hold the last stable offset of %s below the starting offsets; "
                "waiting for them to end",
                _format_partitions(sorted(held)),
            )
        self._holding = held
        return set(held)

    def _heartbeat_due(
        self,
        start: PartitionOffsets,
        end: PartitionOffsets,
        latest: PartitionOffsets,
        partitions: Sequence[TopicPartitionKey],
    ) -> bool:
        """Whether the micro-batch planned now should carry a new idle heartbeat.

        Steps:
        1. Only with ``idleHeartbeatIntervalMs``, and never under AvailableNow: such a run ends with
           its data, and a heartbeat would declare the data the next run reads late.
        2. The input is active when this batch reads anything (``end`` differs from ``start``: new
           offsets, or partitions added, reset or lost), when records wait unread (a backlog held
           back by ``minOffsetsPerTrigger``), or when a latest offset moved since last seen.
           Activity restarts the idle clock; so does the first call after a (re)start, since the
           reader cannot know for how long the input was idle before.
        3. A heartbeat is due once the last activity and the last heartbeat are both at least an
           interval old: heartbeats repeat every interval while the input stays idle, so the
           watermark keeps following the wall clock until the last window has closed.
        4. Not while an open transaction holds a partition's last stable offset below its high
           watermark (read_committed): its records are not visible yet, may carry older
           timestamps, and would be dropped as late once a heartbeat moved the watermark past them.
        """
        interval_ms = self.options.idle_heartbeat_interval_ms
        if interval_ms is None or self._available_now_target is not None:
            return False
        now = time.monotonic()
        reads_something = end != start
        backlog = count_new_offsets(start, latest) > 0
        if self._active_at is None or reads_something or backlog or latest != self._latest_when_active:
            self._active_at = now
            self._latest_when_active = dict(latest)
            self._idle_reported = False
            return False
        quiet_since = max(self._active_at, self._heartbeat_planned_at or self._active_at)
        if (now - quiet_since) * 1000 < interval_ms:
            return False
        if self.options.read_committed and partitions:
            high_watermarks = self.resolver.high_watermarks(partitions)
            held_back = sorted(tp for tp, high in high_watermarks.items() if high > latest.get(tp, high))
            if held_back:
                logger.debug(
                    "no idle heartbeat: open transactions on %s hold back records not yet visible",
                    _format_partitions(held_back),
                )
                return False
        self._heartbeat_planned_at = now
        if not self._idle_reported:
            self._idle_reported = True
            logger.info(
                "input idle for %d ms: planning idle heartbeats every %d ms until records arrive",
                int((now - self._active_at) * 1000),
                interval_ms,
            )
        return True

    def _apply_read_limits(
        self, start: PartitionOffsets, end: PartitionOffsets, limit: ReadLimit, *, may_wait: bool
    ) -> PartitionOffsets:
        """Spark's admission control: ``minOffsetsPerTrigger`` holds the batch back (returns
        ``start``) until enough new offsets exist or ``maxTriggerDelay`` has passed since the last
        batch; ``maxOffsetsPerTrigger`` then caps it. AvailableNow never waits: nothing new comes."""
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else self.options.min_offsets_per_trigger
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_offsets_per_trigger
        if min_rows is not None and self._available_now_target is None:
            now = time.monotonic()
            waited_ms = math.inf if self._last_trigger_at is None else (now - self._last_trigger_at) * 1000
            enough = count_new_offsets(start, end) >= min_rows
            if may_wait and not enough and waited_ms < self.options.max_trigger_delay_ms:
                return dict(start)
            self._last_trigger_at = now
        if max_rows is not None:
            end = rate_limit(max_rows, start, end)
        return end

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return encode_offsets(self._latest) if self._latest else None

    def _partitions(self, *, require_topics: bool, force: bool = False) -> list[TopicPartitionKey]:
        """Topic partitions to read, re-discovered on every call (no discovery interval, as Spark's
        source), when the discovery interval has passed, or only on first use (an interval <= 0)."""
        interval_ms = self.options.partition_discovery_interval_ms
        now = time.monotonic()
        stale = (
            self._known_partitions is None
            or interval_ms is None
            or (interval_ms > 0 and now - self._discovered_at >= interval_ms / 1000)
        )
        if force or require_topics or stale:
            self._known_partitions = self.resolver.partitions(require_topics=require_topics)
            self._discovered_at = now
        assert self._known_partitions is not None
        return self._known_partitions

    # -- planning and reading --

    def partitions(
        self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
    ) -> Sequence[InputPartition]:
        """The offset ranges between ``start`` and ``end`` and, when ``end`` carries a new idle
        heartbeat, one :class:`HeartbeatPartition`. Depends only on the two offsets (invariant 1):
        the split options the batch was planned with are recorded in ``end`` and win over the
        current ones, which apply from the next batch on."""
        # A first micro-batch replayed after a crash gets a start resolved anew, which may differ
        # (retention moved the earliest offset); its checkpointed end knows the start it had.
        begin = first_batch_start(end)
        split = recorded_split(end) or self.options.split
        if split != self.options.split:
            logger.info(
                "planning the micro-batch ending at %s with the split it was first planned with (%s); "
                "the current options (%s) apply from the next micro-batch",
                encode_offsets(decode_offsets(end)),
                split.encode(),
                self.options.split.encode(),
            )
        ranges: list[InputPartition] = list(
            split_offset_ranges(
                offset_ranges(decode_offsets(start) if begin is None else begin, decode_offsets(end)),
                min_partitions=split.min_partitions,
                max_records_per_partition=split.max_records_per_partition,
            )
        )
        heartbeat = heartbeat_partition(start, end)
        if heartbeat is not None:
            ranges.append(heartbeat)
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, HeartbeatPartition):
            return iter([heartbeat_batch(partition, self.options.include_headers)])
        return read_offset_range(partition, self.options)

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        # decode_offsets leaves the heartbeat entry out: it is no partition of the consumer group.
        self._publish_progress(decode_offsets(end))

    def _publish_progress(self, offsets: PartitionOffsets) -> None:
        """Store processed offsets in ``kafka.group.id`` for lag monitoring. Never read back for
        recovery (the checkpoint is the truth), so a failure is logged, not raised."""
        group_id = self.options.group_id
        if (
            not self.options.commit_offsets_on_batch
            or not group_id
            or not offsets
            or offsets == self._published
        ):
            return
        # Remembered even if the commit fails: the engine asks for offsets many times a second when
        # idle, and a group with active members rejects commits until they leave.
        self._published = dict(offsets)
        try:
            self.resolver.admin.commit_offsets(group_id, offsets, retry=False)
        except Exception as error:
            logger.warning(
                "could not commit offsets to consumer group %r (monitoring only): %s", group_id, error
            )

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


# -- batch ------------------------------------------------------------------------------------------


class KafkaBatchReader(DataSourceReader):
    """``spark.read``: one job over ``[startingOffsets, endingOffsets)``."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        admin = self.options.admin()
        try:
            resolver = OffsetResolver(self.options, admin)
            topic_partitions = resolver.partitions(require_topics=True)
            assert self.options.starting is not None and self.options.ending is not None, "set by for_batch()"
            latest = resolver.latest(topic_partitions)
            start = resolver.resolve(
                self.options.starting, topic_partitions, starting=True, latest_snapshot=latest
            )
            end = resolver.resolve(
                self.options.ending, topic_partitions, starting=False, latest_snapshot=latest
            )
        finally:
            admin.close()
        for tp in topic_partitions:
            if start[tp] > end[tp]:
                raise SparkafkaOptionError(
                    f"the starting offset {start[tp]} of topic '{tp[0]}' partition {tp[1]} is after its "
                    f"ending offset {end[tp]} ({self.options.starting.option} / {self.options.ending.option})"
                )
        return split_offset_ranges(
            offset_ranges(start, end),
            min_partitions=self.options.min_partitions,
            max_records_per_partition=self.options.max_records_per_partition,
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_offset_range(partition, self.options)


# -- reading one offset range -----------------------------------------------------------------------

_EOF = KafkaError._PARTITION_EOF
_OFFSET_GONE = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})
_PARTITION_GONE = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)


class _Columns:
    """Column lists of the records read so far, turned into one Arrow RecordBatch at a time.

    The read loop appends to the lists itself, through bound ``append`` methods, in the same pass
    over the messages that checks them: a method call per record costs more than the appends.
    Timestamps are kept as Kafka gives them, type and milliseconds in two lists, and converted a
    column at a time in :meth:`to_batch`. The lists are emptied in place there, so the bound
    methods stay valid for the next batch."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.schema = kafka_arrow_schema(include_headers)
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamp_types: list[int] = []
        self.timestamp_ms: list[int] = []
        self.headers: list[Any] | None = [] if include_headers else None  # Message.headers() values

    def __len__(self) -> int:
        return len(self.offsets)

    def to_batch(self) -> pa.RecordBatch:
        # Imported here, in the executors' workers: the runner Spark starts on the driver for every
        # streaming query never builds a batch, and the import would cost it ~40 ms of CPU each time.
        import pyarrow.compute as pc

        count = len(self.offsets)
        try:
            # Kafka: ms since the epoch; Spark's TimestampType: µs. Spark's own source fails on a
            # timestamp whose µs overflow a long, and so does this (multiply_checked).
            micros = pc.multiply_checked(pa.array(self.timestamp_ms, pa.int64()), 1000)
        except pa.ArrowInvalid as error:
            raise KafkaReadError(
                f"topic '{self.topic}' partition {self.partition}: a record among offsets "
                f"{self.offsets[0]}..{self.offsets[-1]} has a timestamp outside Spark's TimestampType "
                f"(milliseconds {min(self.timestamp_ms)}..{max(self.timestamp_ms)}): {error}"
            ) from None
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), count),
            pa.repeat(pa.scalar(self.partition, pa.int32()), count),
            self._offset_column(count),
            micros.cast(pa.timestamp("us", tz="UTC")),
            self._timestamp_type_column(count),
        ]
        if self.headers is not None:
            # A record without headers gets null, as in Spark's source (confluent-kafka gives None).
            arrays.append(pa.array([h or None for h in self.headers], self.schema.field("headers").type))
            self.headers.clear()
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        for column in (self.keys, self.values, self.offsets, self.timestamp_types, self.timestamp_ms):
            column.clear()
        return batch

    def _offset_column(self, count: int) -> pa.Array:
        """The offsets; a run without gaps is computed from its first offset instead of converted.

        Invariant: a consumer of one partition delivers its records in increasing offset order, once
        each, so ``count`` offsets spanning exactly ``count`` values are the whole run. Gaps (control
        records, aborted or compacted records) take the general conversion. Conversion of the list
        cost about 22 ns per record, the run about 5."""
        import pyarrow.compute as pc  # see to_batch

        first = self.offsets[0]
        if self.offsets[-1] - first != count - 1:
            return pa.array(self.offsets, pa.int64())
        ones = pa.repeat(pa.scalar(1, pa.int64()), count)
        return pc.cumulative_sum(ones, start=pa.scalar(first - 1, pa.int64()))

    def _timestamp_type_column(self, count: int) -> pa.Array:
        """Kafka's TimestampType ids, which Spark's timestampType column shows: one less than
        confluent-kafka's (0 none, 1 create time, 2 log append time become -1, 0, 1).

        A topic's records almost always share one type (its ``message.timestamp.type``): a count of
        the first (C speed) then one repeated value, instead of converting the list (about 32 ns per
        record against 3)."""
        import pyarrow.compute as pc  # see to_batch

        first = self.timestamp_types[0]
        if self.timestamp_types.count(first) == count:
            return pa.repeat(pa.scalar(first - 1, pa.int32()), count)
        return pc.subtract(pa.array(self.timestamp_types, pa.int32()), 1)


def read_offset_range(partition: InputPartition, options: SourceOptions) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the records with ``start <= offset < end`` in one topic partition.

    Offsets may be non-consecutive: with read_committed the client skips control records and
    aborted records, so the record at ``end - 1`` may never be seen. The read is complete as soon
    as any of these holds:

    * a record with offset >= ``end`` arrives (it is not returned);
    * the consumer position (next offset to fetch, past skipped records) reaches ``end``;
    * a partition EOF event reports an offset >= ``end`` (the range ends with skipped records at
      the end of the partition, where no later record moves the position).

    If none holds for ``kafkaConsumer.pollTimeoutMs`` the read fails with a clear error instead of
    hanging. Offsets removed by retention are data loss: fail, or continue at the log start."""
    if not isinstance(partition, OffsetRange) or partition.size <= 0:
        return
    with CONSUMERS.borrow(options.executor_consumer_config()) as consumer:
        yield from _read_with(consumer, partition, options)


def _read_with(
    consumer: Consumer, partition: OffsetRange, options: SourceOptions
) -> Iterator[pa.RecordBatch]:
    topic, number, end = partition.topic, partition.partition, partition.end
    timeout_s = options.api_timeout_ms / 1000
    position = partition.start
    marks = _watermarks(consumer, topic, number, timeout_s, options)
    if marks is None:
        _partition_gone(options, partition, position, "it does not exist")
        return
    if position < marks[0]:
        position = _range_data_loss(partition, position, marks[0], options)
    if position >= end:
        return
    if position > marks[1]:
        # Nothing to fetch there: asking would only bring the offset-reset error back again and again.
        _partition_gone(options, partition, position, f"it now ends at offset {marks[1]}")
        return
    consumer.assign([TopicPartition(topic, number, position)])
    columns = _Columns(topic, number, options.include_headers)
    add_key, add_value, add_offset = columns.keys.append, columns.values.append, columns.offsets.append
    add_type, add_ms = columns.timestamp_types.append, columns.timestamp_ms.append
    add_headers = None if columns.headers is None else columns.headers.append
    last_progress = time.monotonic()
    done = ended_short = False
    while not done:
        messages = consumer.consume(num_messages=min(ARROW_BATCH_ROWS, end - position), timeout=0.1)
        buffered = len(columns)
        for message in messages:
            error = message.error()
            if error is not None:
                code = error.code()
                about = message.topic()
                if about is not None and (about != topic or message.partition() != number):
                    continue  # about another partition: this consumer reads only the one assigned
                if code == _EOF:
                    eof_at = cast(int, message.offset())
                    done = done or eof_at >= end
                    # The range ended at most at the end offset the partition had when it was
                    # planned: an end before it means the log went back, or nothing (asked below).
                    ended_short = ended_short or eof_at < end
                    continue
                CONSUMERS.do_not_reuse(consumer)
                # Both are checked with the cluster first: the client also says "unknown partition"
                # while it has no metadata, as during a broker outage.
                if code in _PARTITION_GONE or code in _OFFSET_GONE:
                    marks = _watermarks(consumer, topic, number, timeout_s, options)
                    if marks is None:
                        _partition_gone(options, partition, position, error.str())
                        done = True
                        break
                    if marks[0] > position:
                        position = _range_data_loss(partition, position, marks[0], options)
                    elif position > marks[1]:
                        _partition_gone(options, partition, position, f"it now ends at offset {marks[1]}")
                        done = True
                        break
                    done = position >= end
                    if not done:
                        consumer.assign([TopicPartition(topic, number, position)])
                    break
                raise KafkaReadError(
                    f"reading topic '{topic}' partition {number} offsets [{partition.start}, {end}) "
                    f"failed at offset {position}: {error.str()}"
                )
            # Not typing.cast: that is a Python call for every record; the annotation costs nothing.
            offset: int = message.offset()  # type: ignore[assignment]  # set on every record
            if offset >= end:
                done = True
                break
            add_key(message.key())
            add_value(message.value())
            add_offset(offset)
            timestamp_type, timestamp_ms = message.timestamp()
            add_type(timestamp_type)
            add_ms(timestamp_ms)
            if add_headers is not None:
                add_headers(message.headers())
            position = offset + 1
        if len(columns) > buffered:
            last_progress = time.monotonic()
        if not done:
            done = position >= end or _consumer_position(consumer, topic, number) >= end
        if columns and (done or len(columns) >= ARROW_BATCH_ROWS):
            yield columns.to_batch()
        if not done and (ended_short or time.monotonic() - last_progress > options.poll_timeout_ms / 1000):
            marks = _watermarks(consumer, topic, number, timeout_s, options)
            if marks is None or marks[1] < end:
                if columns:
                    yield columns.to_batch()  # what the log still had: never dropped
                detail = "it does not exist" if marks is None else f"it now ends at offset {marks[1]}"
                _partition_gone(options, partition, position, detail)
                return
            if ended_short:
                ended_short = False
                continue
            raise KafkaReadError(
                f"reading topic '{topic}' partition {number} offsets [{partition.start}, {end}) made no "
                f"progress for {options.poll_timeout_ms} ms at offset {position} "
                "(option kafkaConsumer.pollTimeoutMs)"
            )


def _consumer_position(consumer: Consumer, topic: str, partition: int) -> int:
    position = consumer.position([TopicPartition(topic, partition)])[0].offset
    return int(position) if position is not None else -1


def _watermarks(
    consumer: Consumer, topic: str, partition: int, timeout_s: float, options: SourceOptions
) -> tuple[int, int] | None:
    """(log start offset, high watermark), or None when the cluster says the partition does not
    exist (any more); a broker outage shorter than ``timeout_s`` is waited out."""
    try:
        return partition_watermarks(consumer, topic, partition, timeout_s)
    except KafkaException as error:
        raise KafkaUnavailableError(
            f"could not read the offsets of topic '{topic}' partition {partition} from Kafka at "
            f"'{options.bootstrap_servers}' within {timeout_s:g} s: {error}"
        ) from None


def _partition_gone(options: SourceOptions, partition: OffsetRange, position: int, detail: str) -> None:
    report_data_loss(
        options,
        f"topic '{partition.topic}' partition {partition.partition} lost offsets "
        f"[{position}, {partition.end}) that were still to be read: {detail} "
        "(the topic was deleted or recreated, or its log truncated)",
        resume_at=partition.end,
    )


def _range_data_loss(partition: OffsetRange, requested: int, available: int, options: SourceOptions) -> int:
    return report_data_loss(
        options,
        f"Cannot read topic '{partition.topic}' partition {partition.partition} from offset {requested}: the "
        f"earliest available offset is {available} "
        f"(requested offset {requested}, available offset {available})",
        resume_at=available,
    )


# -- the data source --------------------------------------------------------------------------------


class KafkaDataSource(DataSource):
    """``spark.readStream.format("sparkafka")`` / ``spark.read.format("sparkafka")``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        # Runs when the DataFrame is created (load()), so option mistakes surface there.
        options = SourceOptions.parse(self.options)
        validate_consumer_config(options.client_config)
        return kafka_schema(options.include_headers)

    def reader(self, schema: StructType) -> KafkaBatchReader:
        options = SourceOptions.parse(self.options)
        _require_fixed_schema(schema, options)
        return KafkaBatchReader(options.for_batch())

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        options = SourceOptions.parse(self.options)
        _require_fixed_schema(schema, options)
        return KafkaStreamReader(options.for_stream())


def _require_fixed_schema(schema: StructType, options: SourceOptions) -> None:
    expected = kafka_schema(options.include_headers)
    if schema != expected:
        raise SparkafkaOptionError(
            "Kafka source has a fixed schema and cannot be set with a custom one: "
            f"expected {expected.simpleString()}, got {schema.simpleString()}"
        )
