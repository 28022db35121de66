"""Reading one offset range in a Spark task: pooled consumers, Arrow batches, and the checks
that a range read exactly what the plan said."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import DataSourceReader, InputPartition

from sparkafka.connector.client_pool import CONSUMERS
from sparkafka.connector.kafka_admin import error_reason, partition_watermarks
from sparkafka.connector.source.options import ARROW_BATCH_ROWS, SourceOptions
from sparkafka.connector.source.ranges import OffsetRange, offset_ranges, split_offset_ranges
from sparkafka.connector.source.resolver import OffsetResolver, report_data_loss
from sparkafka.connector.source.schema import kafka_arrow_schema
from sparkafka.connector.worker_heap import freeze_long_lived_objects
from sparkafka.errors import (
    KafkaReadError,
    KafkaUnavailableError,
    SparkafkaOptionError,
)

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
# Kafka's CORRUPT_MESSAGE: the leader found the stored batch's CRC wrong (librdkafka names it INVALID_MSG).
_DAMAGED = KafkaError.INVALID_MSG
_DAMAGED_HINT = (
    ". The partition leader's stored copy of that batch is damaged, and no record of it is skipped "
    "silently. On a replicated topic another replica may hold an intact copy: make it the leader "
    "(stop the broker holding the damaged copy, or reassign the partition). If no copy is intact, "
    "the batch's records are lost: to go on without them, start the query past them (startingOffsets "
    "on a new checkpoint)"
)
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
    freeze_long_lived_objects("source")
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
                    + (_DAMAGED_HINT if code == _DAMAGED else "")
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
                f"(option kafkaConsumer.pollTimeoutMs){_slow_fetch_hint(options)}"
            )


def _slow_fetch_hint(options: SourceOptions) -> str:
    """Why a read that the cluster says has records may see none: fetches set to wait longer than
    the poll timeout for more bytes than the range holds."""
    wait_ms = options.client_config.get("fetch.wait.max.ms")
    if wait_ms is None or not wait_ms.strip().isdigit() or int(wait_ms) < options.poll_timeout_ms:
        return ""
    return (
        f": kafka.fetch.wait.max.ms={wait_ms} lets the broker hold each fetch that long for "
        "kafka.fetch.min.bytes; keep it below kafkaConsumer.pollTimeoutMs"
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
        reason = error_reason(error)
        raise KafkaUnavailableError(
            f"could not read the offsets of topic '{topic}' partition {partition} from Kafka at bootstrap "
            f"servers '{options.bootstrap_servers}' within {timeout_s:g} s ({reason}). Check "
            "kafka.bootstrap.servers, that the brokers are up and reachable from the Spark executors, and "
            "the security settings (kafka.security.protocol, kafka.sasl.*, kafka.ssl.*); the wait is set "
            "by the option kafka.default.api.timeout.ms"
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
