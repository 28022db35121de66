"""Reading one offset range in a Spark task: pooled consumers, Arrow batches, and the checks
that a range read exactly what the plan said. Runs on the executors: nothing here plans."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from pyspark.sql.datasource import InputPartition

from sparkafka.connector import kafka_errors
from sparkafka.connector.client_pool import CONSUMERS
from sparkafka.connector.kafka_admin import partition_watermarks
from sparkafka.connector.kafka_errors import error_reason
from sparkafka.connector.source.data_loss import report_data_loss
from sparkafka.connector.source.offset_range import OffsetRange
from sparkafka.connector.source.options import ARROW_BATCH_ROWS, SourceOptions
from sparkafka.connector.source.schema import kafka_arrow_schema
from sparkafka.connector.worker_heap import freeze_long_lived_objects
from sparkafka.errors import (
    KafkaReadError,
    KafkaUnavailableError,
)

_DAMAGED_HINT = (
    ". The partition leader's stored copy of that batch is damaged, and no record of it is skipped "
    "silently. On a replicated topic another replica may hold an intact copy: make it the leader "
    "(stop the broker holding the damaged copy, or reassign the partition). If no copy is intact, "
    "the batch's records are lost: to go on without them, start the query past them (startingOffsets "
    "on a new checkpoint)"
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
    return _RangeRead(consumer, partition, options).batches()


class _RangeRead:
    """One offset range read by one assigned consumer, as a loop over explicit events: records,
    the partition's end (EOF), an error, and a stall (no progress). The steps:

    1. Open: the partition's log start and high watermark. Offsets below the log start are data
       loss; a partition gone, or ending below the position, too; a range already past is done.
    2. Records: each one below ``end`` is taken in offset order; one at or past ``end`` ends the
       read (it is not taken).
    3. EOF at or past ``end`` ends the read; one before it marks the read as ended short (the log
       went back, or only skipped records follow), checked at the next stall.
    4. An error about the assigned partition: partition or offsets gone are checked against the
       cluster (the client also says "unknown partition" while it has no metadata) and reported as
       data loss, or the read goes on where records are left; any other error fails the read.
    5. A stall (ended short, or no record for ``kafkaConsumer.pollTimeoutMs``): a log that now ends
       before ``end`` yields what was read and reports the rest as data loss; otherwise the read
       fails, saying so. Nothing read is ever dropped."""

    def __init__(self, consumer: Consumer, partition: OffsetRange, options: SourceOptions) -> None:
        self.consumer = consumer
        self.range = partition
        self.options = options
        self.timeout_s = options.api_timeout_ms / 1000
        self.position = partition.start
        self.columns = _Columns(partition.topic, partition.partition, options.include_headers)
        self.done = False
        self.ended_short = False

    def batches(self) -> Iterator[pa.RecordBatch]:
        if not self._open():
            return
        end, columns = self.range.end, self.columns
        last_progress = time.monotonic()
        while not self.done:
            messages = self.consumer.consume(
                num_messages=min(ARROW_BATCH_ROWS, end - self.position), timeout=0.1
            )
            buffered = len(columns)
            self._take(messages)
            if len(columns) > buffered:
                last_progress = time.monotonic()
            if not self.done:
                self.done = self.position >= end or self._consumer_position() >= end
            if columns and (self.done or len(columns) >= ARROW_BATCH_ROWS):
                yield columns.to_batch()
            stalled = time.monotonic() - last_progress > self.options.poll_timeout_ms / 1000
            if not self.done and (self.ended_short or stalled):
                yield from self._stalled()

    def _open(self) -> bool:
        """Step 1: whether there is anything to read; the consumer assigned at the position."""
        end = self.range.end
        marks = self._watermarks()
        if marks is None:
            _partition_gone(self.options, self.range, self.position, "it does not exist")
            return False
        if self.position < marks[0]:
            self.position = _range_data_loss(self.range, self.position, marks[0], self.options)
        if self.position >= end:
            return False
        if self.position > marks[1]:
            # Nothing to fetch there: asking would only bring the offset-reset error back again and again.
            _partition_gone(self.options, self.range, self.position, f"it now ends at offset {marks[1]}")
            return False
        self._assign()
        return True

    def _take(self, messages: list[Message]) -> None:
        """Steps 2-4 over one poll's messages. The record path stays in this loop with bound
        ``append`` methods: a method call per record would cost more than the appends."""
        end, columns = self.range.end, self.columns
        add_key, add_value, add_offset = columns.keys.append, columns.values.append, columns.offsets.append
        add_type, add_ms = columns.timestamp_types.append, columns.timestamp_ms.append
        add_headers = None if columns.headers is None else columns.headers.append
        position = self.position
        for message in messages:
            error = message.error()
            if error is not None:
                self.position = position
                stop = self._on_error(message, error)
                position = self.position
                if stop:
                    break
                continue
            # Not typing.cast: that is a Python call for every record; the annotation costs nothing.
            offset: int = message.offset()  # type: ignore[assignment]  # set on every record
            if offset >= end:
                self.done = True
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
        self.position = position

    def _on_error(self, message: Message, error: KafkaError) -> bool:
        """Steps 3 and 4: whether the rest of this poll's messages is to be dropped (the consumer
        was assigned anew, or the read ended)."""
        topic, number, end = self.range.topic, self.range.partition, self.range.end
        code = error.code()
        about = message.topic()
        if about is not None and (about != topic or message.partition() != number):
            return False  # about another partition: this consumer reads only the one assigned
        if code == kafka_errors.PARTITION_EOF:
            eof_at = cast(int, message.offset())
            self.done = self.done or eof_at >= end
            # The range ended at most at the end offset the partition had when it was planned: an
            # end before it means the log went back, or nothing (asked at the next stall).
            self.ended_short = self.ended_short or eof_at < end
            return False
        CONSUMERS.do_not_reuse(self.consumer)
        if code in kafka_errors.PARTITION_GONE or code in kafka_errors.OFFSET_GONE:
            self._recover(error.str())
            return True
        hint = _DAMAGED_HINT if code == kafka_errors.DAMAGED_BATCH else ""
        raise KafkaReadError(
            f"reading topic '{topic}' partition {number} offsets [{self.range.start}, {end}) "
            f"failed at offset {self.position}: {error.str()}{hint}"
        )

    def _recover(self, reason: str) -> None:
        """Step 4's check with the cluster, after the client said the partition or the position is gone."""
        marks = self._watermarks()
        if marks is None:
            _partition_gone(self.options, self.range, self.position, reason)
            self.done = True
            return
        if marks[0] > self.position:
            self.position = _range_data_loss(self.range, self.position, marks[0], self.options)
        elif self.position > marks[1]:
            _partition_gone(self.options, self.range, self.position, f"it now ends at offset {marks[1]}")
            self.done = True
            return
        self.done = self.position >= self.range.end
        if not self.done:
            self._assign()

    def _stalled(self) -> Iterator[pa.RecordBatch]:
        """Step 5."""
        end = self.range.end
        marks = self._watermarks()
        if marks is None or marks[1] < end:
            if self.columns:
                yield self.columns.to_batch()  # what the log still had: never dropped
            detail = "it does not exist" if marks is None else f"it now ends at offset {marks[1]}"
            _partition_gone(self.options, self.range, self.position, detail)
            self.done = True
            return
        if self.ended_short:
            self.ended_short = False
            return
        raise KafkaReadError(
            f"reading topic '{self.range.topic}' partition {self.range.partition} offsets "
            f"[{self.range.start}, {end}) made no progress for {self.options.poll_timeout_ms} ms at offset "
            f"{self.position} (option kafkaConsumer.pollTimeoutMs){_slow_fetch_hint(self.options)}"
        )

    def _assign(self) -> None:
        self.consumer.assign([TopicPartition(self.range.topic, self.range.partition, self.position)])

    def _consumer_position(self) -> int:
        return _consumer_position(self.consumer, self.range.topic, self.range.partition)

    def _watermarks(self) -> tuple[int, int] | None:
        return _watermarks(
            self.consumer, self.range.topic, self.range.partition, self.timeout_s, self.options
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
