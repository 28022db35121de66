"""Kafka v2 record batches (magic 2): parse, validate, re-offset, encode, decode and dump them.

The format is Kafka's `DefaultRecordBatch` (all integers big-endian)::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (=2) | crc uint32
    | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64
    | producerId int64 | producerEpoch int16 | baseSequence int32 | recordsCount int32 | records...

`batchLength` counts the bytes after itself; the CRC32C covers everything from `attributes` to the end,
so the broker can rewrite `baseOffset` and `partitionLeaderEpoch` without recomputing it.
Records (possibly compressed as one blob) are::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
    | keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value
    | headersCount varint | [headerKeyLength varint | headerKey utf8 | headerValueLength varint | headerValue]

All varints are zigzag encoded. Error codes and messages follow Kafka's `ProduceRequest.validateRecords`,
`UnifiedLog.analyzeAndValidateRecords`, `LogValidator` and `DefaultRecord.readFrom`.
"""

from __future__ import annotations

import functools
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import crc32c

from sparkafka.broker.errors import BrokerError, ErrorCode

Buffer = bytes | bytearray | memoryview

HEADER_SIZE = 61  # bytes of the v2 batch header incl. baseOffset+batchLength
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes batchLength does not count
MAGIC = 2

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT64 = struct.Struct(">q")
_ATTRIBUTES = struct.Struct(">h")
_PARTITION_LEADER_EPOCH_OFFSET = 12
_MAGIC_OFFSET = 16
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21
_MAX_TIMESTAMP_OFFSET = 35
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
# Kafka's ByteBufferLogInputStream rejects any batch length below the smallest legacy (v0) record.
_MIN_ANY_FORMAT_LENGTH = 14

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_FLAG = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40

CREATE_TIME = 0
LOG_APPEND_TIME = 1
NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

COMPRESSION_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")
_CODEC_PIP_PACKAGES = {2: "python-snappy", 3: "lz4", 4: "zstandard"}
_CONTROL_TYPE_NAMES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_END_TXN_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch


class CorruptBatchError(ValueError):
    """Bytes that are not a complete, valid v2 batch.

    `valid_bytes` is the length of the prefix made of complete valid batches (what a log keeps when
    it truncates a torn tail). `incomplete_size` is set when the bytes merely stop short, to the number
    of bytes the cut-off batch needs from its start; it is None when the bytes are wrong, not short.
    """

    def __init__(self, message: str, *, valid_bytes: int = 0, incomplete_size: int | None = None) -> None:
        super().__init__(message)
        self.valid_bytes = valid_bytes
        self.incomplete_size = incomplete_size


class DecompressionError(CorruptBatchError):
    """A batch whose compressed record blob cannot be decompressed."""


class InvalidRecordError(ValueError):
    """A record inside a batch is malformed (Kafka's InvalidRecordException); the message is Kafka's."""


class CodecUnavailableError(RuntimeError):
    """The Python library needed for a batch's compression codec is not installed."""


class ProduceRequestRecordsError(BrokerError):
    """Kafka's ProduceRequest.validateRecords refused a partition's records (no batch, a magic other
    than 2, more than one batch): KafkaApis answers that before the partition's log is involved, so the
    Produce response carries no log start offset for it, unlike errors found while appending."""


class RecordValidationError(BrokerError):
    """Some records of a batch were rejected; `record_errors` holds (batch index, message) per record.

    The Produce response reports these per record (ProduceResponse RecordErrors), as Kafka does.
    """

    def __init__(self, code: ErrorCode, message: str, record_errors: Sequence[tuple[int, str]]) -> None:
        super().__init__(code, message)
        self.record_errors = tuple(record_errors)


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap from 2**31-1 to 0."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_FLAG else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def delete_horizon_ms(self) -> int | None:
        """Set by compaction on batches holding tombstones; Kafka stores it in baseTimestamp."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_FLAG else None

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    # Header keys are decoded with surrogateescape so that invalid UTF-8 survives a re-encode unchanged.
    headers: tuple[tuple[str, bytes | None], ...] = ()


def parse_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Parse the 61-byte v2 header at `pos`; CorruptBatchError if it is short, not magic 2 or too small."""
    available = len(buf) - pos
    if available < HEADER_SIZE:
        raise CorruptBatchError(
            f"record batch at byte {pos} is truncated: a v2 batch header needs {HEADER_SIZE} bytes, "
            f"only {available} remain",
            valid_bytes=pos,
            incomplete_size=HEADER_SIZE,
        )
    header = BatchHeader(*_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC:
        raise CorruptBatchError(
            f"record batch at byte {pos} has magic {header.magic}; only magic 2 batches (Kafka >= 0.11 "
            "clients) are supported",
            valid_bytes=pos,
        )
    if header.batch_length < _MIN_BATCH_LENGTH:
        raise CorruptBatchError(
            f"record batch at byte {pos} declares batchLength {header.batch_length}, below the "
            f"{_MIN_BATCH_LENGTH}-byte minimum of a v2 header",
            valid_bytes=pos,
        )
    return header


def compute_crc(batch: Buffer, header: BatchHeader) -> int:
    return int(crc32c.crc32c(memoryview(batch)[_ATTRIBUTES_OFFSET : header.size]))


def crc_is_valid(batch: Buffer, header: BatchHeader) -> bool:
    return len(batch) >= header.size and compute_crc(batch, header) == header.crc


def iter_batches(
    buf: Buffer, *, validate_crc: bool = False, base_position: int = 0
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each complete batch in `buf`, in order.

    Stops cleanly when the batches end exactly at the end of `buf`. Otherwise raises CorruptBatchError
    once the complete valid prefix has been yielded: `valid_bytes` is that prefix's length, and
    `incomplete_size` tells a caller reading a file in chunks how many bytes the cut-off batch needs.
    `base_position` is where `buf` sits in its file: it is added to positions, messages and valid_bytes.
    """
    view = memoryview(buf)
    end = len(view)
    pos = 0
    while pos < end:
        at = base_position + pos
        remaining = end - pos
        if remaining < HEADER_SIZE:
            needed = HEADER_SIZE
            if remaining >= LOG_OVERHEAD:
                (length,) = _INT32.unpack_from(view, pos + 8)
                if length < _MIN_BATCH_LENGTH:
                    raise CorruptBatchError(
                        f"record batch at byte {at} declares batchLength {length}, below the "
                        f"{_MIN_BATCH_LENGTH}-byte minimum of a v2 header",
                        valid_bytes=at,
                    )
                needed = LOG_OVERHEAD + length
            if remaining > _MAGIC_OFFSET and view[pos + _MAGIC_OFFSET] != MAGIC:
                raise CorruptBatchError(
                    f"record batch at byte {at} has magic {view[pos + _MAGIC_OFFSET]}; only magic 2 is "
                    "supported",
                    valid_bytes=at,
                )
            raise CorruptBatchError(
                f"record batch at byte {at} is truncated: {remaining} bytes remain of at least {needed}",
                valid_bytes=at,
                incomplete_size=needed,
            )
        try:
            header = parse_header(view, pos)
        except CorruptBatchError as exc:
            raise CorruptBatchError(f"at byte {at}: {exc}", valid_bytes=at) from None
        if header.size > remaining:
            raise CorruptBatchError(
                f"record batch at byte {at} (baseOffset {header.base_offset}) is truncated: it declares "
                f"{header.size} bytes, only {remaining} remain",
                valid_bytes=at,
                incomplete_size=header.size,
            )
        if validate_crc:
            actual = compute_crc(view[pos : pos + header.size], header)
            if actual != header.crc:
                raise CorruptBatchError(
                    f"record batch at byte {at} (baseOffset {header.base_offset}) is corrupt: stored crc "
                    f"{header.crc}, computed crc {actual}",
                    valid_bytes=at,
                )
        yield at, header
        pos += header.size


def first_batch_is_transactional(buf: Buffer | None) -> bool:
    """Whether the first batch of a Produce partition entry is marked transactional (Kafka's
    RequestUtils.hasTransactionalRecords looks at that batch only; magic 0 and 1 have no such flag)."""
    if buf is None or len(buf) < _ATTRIBUTES_OFFSET + _ATTRIBUTES.size:
        return False
    view = memoryview(buf)
    if view[_MAGIC_OFFSET] != MAGIC:
        return False
    return bool(_ATTRIBUTES.unpack_from(view, _ATTRIBUTES_OFFSET)[0] & TRANSACTIONAL_FLAG)


def _produce_batch_size(view: memoryview, pos: int) -> int | None:
    """Size of the complete batch at `pos`, or None if none fits (Kafka's ByteBufferLogInputStream)."""
    remaining = len(view) - pos
    if remaining < LOG_OVERHEAD:
        return None
    (length,) = _INT32.unpack_from(view, pos + 8)
    if length < _MIN_ANY_FORMAT_LENGTH:
        raise BrokerError(
            ErrorCode.CORRUPT_MESSAGE,
            f"Record size {length} is less than the minimum record overhead ({_MIN_ANY_FORMAT_LENGTH})",
        )
    if remaining <= _MAGIC_OFFSET:
        return None
    magic = struct.unpack_from(">b", view, pos + _MAGIC_OFFSET)[0]
    if magic < 0 or magic > MAGIC:
        raise BrokerError(ErrorCode.CORRUPT_MESSAGE, f"Invalid magic found in record: {magic}")
    size = LOG_OVERHEAD + length
    return size if remaining >= size else None


@dataclass(frozen=True)
class TimestampRules:
    """A topic's timestamp settings as LogValidator applies them to produced records."""

    log_append_time: bool = False  # message.timestamp.type=LogAppendTime
    before_max_ms: int = INT64_MAX  # message.timestamp.before.max.ms
    after_max_ms: int = 3_600_000  # message.timestamp.after.max.ms (Kafka 4's default: one hour)


@dataclass(frozen=True)
class AcceptedBatch:
    header: BatchHeader
    # LogValidator's maxBatchTimestamp: the largest record timestamp, at least NO_TIMESTAMP. A CreateTime
    # topic stores it as the batch's maxTimestamp, whatever the producer wrote there.
    max_record_timestamp: int


def check_produce_request_records(buf: Buffer, produce_version: int | None = None) -> int:
    """Step 1 of :func:`validate_produce_payload` alone (Kafka's ProduceRequest.validateRecords, which
    KafkaApis runs before anything else looks at the records): the size of the one v2 batch."""
    view = memoryview(buf)
    invalid = ErrorCode.INVALID_RECORD
    requests = "Produce requests" + ("" if produce_version is None else f" with version {produce_version}")
    size = _produce_batch_size(view, 0)
    if size is None:
        raise ProduceRequestRecordsError(
            invalid, f"{requests} must have at least one record batch per partition"
        )
    if view[_MAGIC_OFFSET] != MAGIC:
        raise ProduceRequestRecordsError(
            invalid, f"{requests} are only allowed to contain record batches with magic version 2"
        )
    if _produce_batch_size(view, size) is not None:
        raise ProduceRequestRecordsError(
            invalid, f"{requests} are only allowed to contain exactly one record batch per partition"
        )
    return size


def transactional_producer(buf: Buffer) -> tuple[int, int] | None:
    """(producer id, epoch) of a v2 batch at the start of ``buf`` marked transactional, else None;
    None too for a batch whose header does not hold together: validation refuses it (CORRUPT_MESSAGE,
    as any other batch), with no transaction to verify first."""
    if len(buf) < HEADER_SIZE or not first_batch_is_transactional(buf):
        return None
    try:
        header = parse_header(memoryview(buf))
    except CorruptBatchError:
        return None
    return header.producer_id, header.producer_epoch


def validate_produce_payload(
    buf: Buffer,
    *,
    max_batch_bytes: int,
    topic_partition: str = "<unknown>",
    produce_version: int | None = None,
    require_keys: bool = False,
    now_ms: int = 0,
    timestamps: TimestampRules | None = None,
) -> list[AcceptedBatch]:
    """Validate one partition's records from a Produce request (v3+) exactly as Kafka does.

    Steps, in Kafka's order (each raises BrokerError with Kafka's code and message):
      1. ProduceRequest.validateRecords: at least one complete batch (INVALID_RECORD), a readable
         length >= 14 and magic in 0..2 (CORRUPT_MESSAGE), magic == 2 (INVALID_RECORD), exactly one batch
         (INVALID_RECORD). Kafka silently trims a trailing partial batch; we refuse it (CORRUPT_MESSAGE)
         rather than drop bytes a client sent.
      2. UnifiedLog.analyzeAndValidateRecords: baseOffset == 0 (INVALID_RECORD), size <= max_batch_bytes
         (MESSAGE_TOO_LARGE), CRC32C matches (CORRUPT_MESSAGE), known codec (UNKNOWN_SERVER_ERROR).
      3. LogValidator.validateBatch: lastOffsetDelta+1 >= 1, recordsCount >= 1 and they agree, not a
         control batch, a producer id implies a sequence (all INVALID_RECORD).
      4. Every record decodes and recordsCount matches the records present, after decompression
         (INVALID_RECORD; a blob that does not decompress is UNKNOWN_SERVER_ERROR as in Kafka).
      5. LogValidator.validateRecord, for every record: with `require_keys` (compacted topics) it needs a
         key (INVALID_RECORD); otherwise, with `timestamps`, on a CreateTime topic a timestamp other
         than NO_TIMESTAMP must lie within [now - before.max.ms, now + after.max.ms], and a batch the
         producer marked LogAppendTime is refused on a LogAppendTime topic, and on a CreateTime topic
         when its maxTimestamp is NO_TIMESTAMP (INVALID_TIMESTAMP). All records are checked; any error
         rejects the batch, reporting each record's (RecordValidationError), INVALID_TIMESTAMP if any
         of them is one.
    Returns the accepted batches (always exactly one), with their largest record timestamp.
    """
    view = memoryview(buf)
    tp = topic_partition
    invalid = ErrorCode.INVALID_RECORD
    size = check_produce_request_records(view, produce_version)
    if len(view) > size:
        raise BrokerError(
            ErrorCode.CORRUPT_MESSAGE,
            f"The records for {tp} carry {len(view) - size} bytes after the record batch that do not form a "
            "complete batch; the client must send whole batches only",
        )

    (base_offset,) = _INT64.unpack_from(view, 0)
    if base_offset != 0:
        raise BrokerError(
            invalid,
            f"The baseOffset of the record batch in the append to {tp} should be 0, but it is {base_offset}",
        )
    if size > max_batch_bytes:
        raise BrokerError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"The record batch size in the append to {tp} is {size} bytes which exceeds the "
            f"maximum configured value of {max_batch_bytes}.",
        )
    (stored_crc,) = _UINT32.unpack_from(view, _CRC_OFFSET)
    if size < HEADER_SIZE or crc32c.crc32c(view[_ATTRIBUTES_OFFSET:size]) != stored_crc:
        raise BrokerError(
            ErrorCode.CORRUPT_MESSAGE,
            f"Record is corrupt (stored crc = {stored_crc}) in topic partition {tp}.",
        )
    header = parse_header(view)
    if header.compression >= len(COMPRESSION_NAMES):
        raise BrokerError(
            ErrorCode.UNKNOWN_SERVER_ERROR, f"Unknown compression type id: {header.compression}"
        )

    offset_range = f"[{header.base_offset}, {header.last_offset}]"
    count_from_offsets = header.last_offset_delta + 1
    if count_from_offsets <= 0:
        raise BrokerError(
            invalid, f"Batch has an invalid offset range: {offset_range} in topic partition {tp}"
        )
    if header.record_count <= 0:
        raise BrokerError(
            invalid, f"Invalid reported count for record batch: {header.record_count} in topic partition {tp}"
        )
    if count_from_offsets != header.record_count:
        raise BrokerError(
            invalid,
            f"Inconsistent batch offset range {offset_range} and count of records {header.record_count} "
            f"in topic partition {tp}",
        )
    if header.is_control:
        raise BrokerError(
            invalid, f"Clients are not allowed to write control records in topic partition {tp}"
        )
    if header.has_producer_id and header.base_sequence < 0:
        raise BrokerError(
            invalid,
            f"Invalid sequence number {header.base_sequence} in record batch with producerId "
            f"{header.producer_id} in topic partition {tp}",
        )

    whole = buf if len(buf) == size else view[:size]
    try:
        scan = scan_records(whole, header)
    except InvalidRecordError as exc:
        raise BrokerError(invalid, str(exc)) from exc
    except (DecompressionError, CodecUnavailableError) as exc:
        raise BrokerError(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)) from exc

    if (require_keys and scan.keyless) or (
        timestamps is not None and _timestamps_may_fail(header, scan, now_ms, timestamps)
    ):
        _check_each_record(whole, header, tp, require_keys, now_ms, timestamps)
    return [AcceptedBatch(header, max(NO_TIMESTAMP, scan.max_timestamp))]


# Timestamps this far from zero may make Kafka's long arithmetic wrap: checked record by record.
_SAFE_TIMESTAMP = 2**61


def _timestamps_may_fail(header: BatchHeader, scan: RecordScan, now_ms: int, rules: TimestampRules) -> bool:
    """Whether some record of the batch may fail LogValidator.validateTimestamp, from the extremes of the
    record timestamps; False means none does."""
    marked_log_append_time = header.timestamp_type == LOG_APPEND_TIME
    if rules.log_append_time:
        return marked_log_append_time
    if marked_log_append_time and scan.max_timestamp == NO_TIMESTAMP:
        return True
    if max(abs(scan.min_timestamp), abs(scan.max_timestamp)) >= _SAFE_TIMESTAMP:
        return True
    return (
        now_ms - scan.min_timestamp > rules.before_max_ms or scan.max_timestamp - now_ms > rules.after_max_ms
    )


def _check_each_record(
    batch: Buffer, header: BatchHeader, tp: str, require_keys: bool, now_ms: int, rules: TimestampRules | None
) -> None:
    """LogValidator.validateRecord for every record and processRecordErrors: raise RecordValidationError
    with each failing record's index and Kafka's message, or return when none fails."""
    errors: list[tuple[int, str]] = []
    timestamp_error = False
    marked_log_append_time = header.timestamp_type == LOG_APPEND_TIME
    for index, record in enumerate(decode_records(batch)):
        if require_keys and record.key is None:
            errors.append(
                (index, f"Compacted topic cannot accept message without key in topic partition {tp}")
            )
            continue
        if rules is None:
            continue
        timestamp = _as_long(record.timestamp)
        if not rules.log_append_time and timestamp != NO_TIMESTAMP:
            difference = _as_long(now_ms - timestamp)
            if difference > rules.before_max_ms or _as_long(-difference) > rules.after_max_ms:
                timestamp_error = True
                errors.append(
                    (
                        index,
                        f"Timestamp {timestamp} of message with offset {record.offset} is out of range. The "
                        f"timestamp should be within [{_as_long(now_ms - rules.before_max_ms)}, "
                        f"{_as_long(now_ms + rules.after_max_ms)}]",
                    )
                )
        elif marked_log_append_time:
            timestamp_error = True
            described = (
                f"DefaultRecord(offset={record.offset}, timestamp={timestamp}, "
                f"key={len(record.key or b'')} bytes, value={len(record.value or b'')} bytes)"
            )
            errors.append(
                (
                    index,
                    f"Invalid timestamp type in message {described}. Producer should not set timestamp type "
                    "to LogAppendTime.",
                )
            )
    if not errors:
        return
    if timestamp_error:
        raise RecordValidationError(
            ErrorCode.INVALID_TIMESTAMP,
            "One or more records have been rejected due to invalid timestamp",
            errors,
        )
    shown = ", ".join(f"RecordError(batchIndex={index}, message='{text}')" for index, text in errors[:3])
    raise RecordValidationError(
        ErrorCode.INVALID_RECORD,
        f"One or more records have been rejected due to {len(errors)} record errors in total, and "
        f"only showing the first three errors at most: [{shown}]",
        errors,
    )


def assign_offset_in_place(batch: bytearray, base_offset: int, *, partition_leader_epoch: int = 0) -> None:
    """Rewrite baseOffset and partitionLeaderEpoch of the batch at the start of `batch` (CRC unaffected)."""
    if len(batch) < HEADER_SIZE:
        raise ValueError(
            f"cannot assign an offset to {len(batch)} bytes: a v2 batch has >= {HEADER_SIZE} bytes"
        )
    _INT64.pack_into(batch, 0, base_offset)
    _INT32.pack_into(batch, _PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)


def set_max_timestamp_in_place(batch: bytearray, timestamp_type: int, max_timestamp: int) -> None:
    """Kafka's DefaultRecordBatch.setMaxTimestamp on the v2 batch at the start of `batch`, as LogValidator
    applies it to every produced batch: LogAppendTime topics stamp the broker's append time, CreateTime
    topics the largest record timestamp (which also clears a LogAppendTime mark a producer set).

    Steps: nothing if the batch already has this type and maxTimestamp; else set or clear the
    timestamp-type bit of the attributes, write `max_timestamp`, recompute the CRC32C (it covers the
    attributes onwards). The base timestamp and the records' deltas stay as the producer wrote them: in
    a LogAppendTime batch every reader takes maxTimestamp as each record's timestamp."""
    if len(batch) < HEADER_SIZE:
        raise ValueError(f"cannot stamp {len(batch)} bytes: a v2 batch has >= {HEADER_SIZE} bytes")
    if timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
        raise ValueError(f"timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime), got {timestamp_type}")
    (attributes,) = _ATTRIBUTES.unpack_from(batch, _ATTRIBUTES_OFFSET)
    stamped = (attributes & ~TIMESTAMP_TYPE_FLAG) | (TIMESTAMP_TYPE_FLAG if timestamp_type else 0)
    (current,) = _INT64.unpack_from(batch, _MAX_TIMESTAMP_OFFSET)
    if stamped == attributes and current == max_timestamp:
        return
    _ATTRIBUTES.pack_into(batch, _ATTRIBUTES_OFFSET, stamped)
    _INT64.pack_into(batch, _MAX_TIMESTAMP_OFFSET, max_timestamp)
    (batch_length,) = _INT32.unpack_from(batch, 8)
    end = LOG_OVERHEAD + batch_length
    _UINT32.pack_into(batch, _CRC_OFFSET, crc32c.crc32c(memoryview(batch)[_ATTRIBUTES_OFFSET:end]))


def assign_offset(batch: Buffer, base_offset: int, *, partition_leader_epoch: int = 0) -> bytes:
    """Return `batch` with baseOffset and partitionLeaderEpoch rewritten; the CRC does not cover them."""
    if len(batch) < HEADER_SIZE:
        raise ValueError(
            f"cannot assign an offset to {len(batch)} bytes: a v2 batch has >= {HEADER_SIZE} bytes"
        )
    out = bytearray(batch)
    _INT64.pack_into(out, 0, base_offset)
    _INT32.pack_into(out, _PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)
    return bytes(out)


# ---------------------------------------------------------------------------------------------------
# varints


class _Underflow(Exception):
    """Internal: a read ran past the bytes it was allowed to use."""


def _write_varint(value: int, out: bytearray) -> None:
    # Zigzag over 64 bits equals Kafka's 32-bit zigzag for every value that fits in an int32.
    unsigned = (value << 1) ^ (value >> 63)
    while unsigned >= 0x80:
        out.append((unsigned & 0x7F) | 0x80)
        unsigned >>= 7
    out.append(unsigned)


def _read_varint(data: bytes, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    result = 0
    shift = 0
    for _ in range(max_bytes):
        if pos >= end:
            raise _Underflow
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise InvalidRecordError(f"Varint is too long: more than {max_bytes} bytes at byte {pos - max_bytes}")


def _read_bytes(data: bytes, pos: int, end: int, length: int) -> tuple[bytes | None, int]:
    if length < 0:
        return None, pos
    if pos + length > end:
        raise _Underflow
    return data[pos : pos + length], pos + length


# ---------------------------------------------------------------------------------------------------
# decoding


def _decompress(header: BatchHeader, blob: bytes) -> bytes:
    compression = header.compression
    if compression >= len(COMPRESSION_NAMES):
        raise CorruptBatchError(
            f"batch at offset {header.base_offset} uses unknown compression id {compression}"
        )
    name = COMPRESSION_NAMES[compression]
    codec = _codec_module(compression, f"batch at offset {header.base_offset}")
    decoders = {1: codec.gzip_decode, 2: codec.snappy_decode, 3: codec.lz4_decode, 4: codec.zstd_decode}
    try:
        return bytes(decoders[compression](blob))
    except Exception as exc:  # each codec library raises its own exception types
        raise DecompressionError(
            f"Failed to decompress record stream: {name} batch at offset {header.base_offset}: {exc}"
        ) from exc


def _codec_module(compression: int, what: str) -> Any:
    """kafka-python's codec helpers, after checking the codec's library is installed."""
    from kafka import codec

    available = {2: codec.has_snappy, 3: codec.has_lz4, 4: codec.has_zstd}.get(compression, codec.has_gzip)
    if not available():
        name = COMPRESSION_NAMES[compression]
        raise CodecUnavailableError(
            f"{what} is {name}-compressed but the Python library for {name} is missing; install it with "
            f"`pip install {_CODEC_PIP_PACKAGES[compression]}`"
        )
    return codec


def _compress(compression: int, blob: bytes) -> bytes:
    codec = _codec_module(compression, "the batch being encoded")
    encoders = {1: codec.gzip_encode, 2: codec.snappy_encode, 3: codec.lz4_encode, 4: codec.zstd_encode}
    return bytes(encoders[compression](blob))


def _decode_record_bytes(header: BatchHeader, data: bytes) -> list[Record]:
    """Decode `record_count` records from the (decompressed) record bytes, with Kafka's error messages."""
    if header.record_count < 0:
        raise InvalidRecordError(f"Found invalid record count {header.record_count} in magic v2 batch")
    log_append_time = header.max_timestamp if header.timestamp_type == LOG_APPEND_TIME else None
    records: list[Record] = []
    end = len(data)
    pos = 0
    for _ in range(header.record_count):
        try:
            body_size, pos = _read_varint(data, pos, end, 5)
        except _Underflow:
            raise InvalidRecordError("Incorrect declared batch size, premature EOF reached") from None
        if body_size < 0 or end - pos < body_size:
            raise InvalidRecordError(
                f"Invalid record size: expected {body_size} bytes in record payload, but instead the buffer "
                f"has only {end - pos} remaining bytes."
            )
        record_end = pos + body_size
        try:
            pos += 1  # record attributes: unused in v2
            timestamp_delta, pos = _read_varint(data, pos, record_end, 10)
            offset_delta, pos = _read_varint(data, pos, record_end, 5)
            key_length, pos = _read_varint(data, pos, record_end, 5)
            key, pos = _read_bytes(data, pos, record_end, key_length)
            value_length, pos = _read_varint(data, pos, record_end, 5)
            value, pos = _read_bytes(data, pos, record_end, value_length)
            header_count, pos = _read_varint(data, pos, record_end, 5)
            if header_count < 0:
                raise InvalidRecordError(f"Found invalid number of record headers {header_count}")
            if header_count > record_end - pos:
                raise InvalidRecordError(
                    f"Found invalid number of record headers. {header_count} is larger than the remaining "
                    "size of the buffer"
                )
            headers: list[tuple[str, bytes | None]] = []
            for _ in range(header_count):
                key_size, pos = _read_varint(data, pos, record_end, 5)
                if key_size < 0:
                    raise InvalidRecordError(f"Invalid negative header key size {key_size}")
                header_key, pos = _read_bytes(data, pos, record_end, key_size)
                header_value_size, pos = _read_varint(data, pos, record_end, 5)
                header_value, pos = _read_bytes(data, pos, record_end, header_value_size)
                headers.append(((header_key or b"").decode("utf-8", "surrogateescape"), header_value))
        except _Underflow:
            raise InvalidRecordError("Found invalid record structure") from None
        if pos != record_end:
            raise InvalidRecordError(
                f"Invalid record size: expected to read {body_size} bytes in record payload, but instead "
                f"read {pos - (record_end - body_size)}"
            )
        timestamp = header.base_timestamp + timestamp_delta if log_append_time is None else log_append_time
        records.append(Record(header.base_offset + offset_delta, timestamp, key, value, tuple(headers)))
    if pos != end:
        raise InvalidRecordError("Incorrect declared batch size, records still remaining in file")
    return records


class _NotFast(Exception):
    """Internal: the fast record walk met something only the full decoder may judge."""


def _varint_end(data: bytes | bytearray, pos: int, max_bytes: int) -> int:
    """Position after the varint at `pos` (no value needed); _NotFast if it is longer than max_bytes."""
    for end in range(pos, pos + max_bytes):
        if data[end] < 0x80:
            return end + 1
    raise _NotFast


def _varint_value(data: bytes | bytearray, pos: int, max_bytes: int = 5) -> tuple[int, int]:
    """(zigzag-decoded value, next position) of the varint at `pos`; _NotFast past `max_bytes` (5 for an
    int32, 10 for a long)."""
    result = shift = 0
    for end in range(pos, pos + max_bytes):
        byte = data[end]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), end + 1
        shift += 7
    raise _NotFast


# Bytes sets for bytes.lstrip: how many leading bytes of a strided slice satisfy one run constraint.
_CONTINUATION_BYTES = bytes(range(0x80, 0x100))  # a varint byte with more to follow
_FINAL_BYTES = bytes(range(0x80))  # the last byte of a varint
_EXACT_BYTES = tuple(bytes([value]) for value in range(256))
# One-byte zigzag varints: the value of each byte, and (for bytes.translate over a column of them) a
# byte that sorts as the value does: value + 64.
_ONE_BYTE_VALUE = tuple((byte >> 1) ^ -(byte & 1) for byte in range(0x80))
_ONE_BYTE_RANK = bytes(value + 64 for value in _ONE_BYTE_VALUE) + bytes(0x80)
_AT_MOST = tuple(bytes(range(value + 1)) for value in range(256))  # translate(None, delete=...) keeps > value
_ABOVE = tuple(bytes(range(value + 1, 256)) for value in range(256))  # ... keeps <= value


def _byte_extremes(column: bytes | bytearray) -> tuple[int, int]:
    """(smallest, largest) byte of a non-empty column. Bisected with bytes.translate, a pass in C each
    (14 at most), as min() and max() take a Python object per byte: a third of their time on 2,000 bytes."""
    low, high = 0, 255
    while low < high:  # the smallest: is some byte <= mid?
        mid = (low + high) // 2
        if column.translate(None, _ABOVE[mid]):
            high = mid
        else:
            low = mid + 1
    smallest = low
    low, high = smallest, 255
    while low < high:  # the largest: is some byte > mid?
        mid = (low + high) // 2
        if column.translate(None, _AT_MOST[mid]):
            low = mid + 1
        else:
            high = mid
    return smallest, low


@functools.cache
def _two_byte_values() -> tuple[int, ...]:
    """The value of every two-byte zigzag varint, indexed by its bytes read as a little-endian uint16
    (first byte | second << 8); other indexes hold 0."""
    values = [0] * 65536
    for second in range(0x80):
        for first in range(0x80, 0x100):
            raw = (first & 0x7F) | (second << 7)
            values[first | second << 8] = (raw >> 1) ^ -(raw & 1)
    return tuple(values)


# The walk tries a run after the first _FIRST_RUN_TRY records and _RUN_INTERVAL records after each run
# that paid (at least _MIN_RUN records); after one that did not it waits _RUN_BACKOFF records, doubling
# each time, so that batches of varied sizes pay for O(log records) tries only.
_FIRST_RUN_TRY = 3
_RUN_INTERVAL = 16
_MIN_RUN = 16
_RUN_BACKOFF = 64


@dataclass(frozen=True)
class _Template:
    size: int  # the record's bytes, its length varint included
    shape: list[tuple[int, bytes]]  # (byte position relative to its start, bytes that byte may be)
    keyless: bool
    timestamp_at: int  # where its timestamp delta starts, relative to its start
    timestamp_width: int  # the bytes of that varint


def _record_template(data: bytes | bytearray, pos: int, end: int) -> _Template | None:
    """Parse the record at `pos` the way _decode_record_bytes does and describe its shape, or None if it
    is malformed or unusual.

    A record whose bytes at those positions are in those sets parses the same way: the varints whose value
    matters (lengths, key and value sizes, header count and sizes) have identical bytes, the two it only
    skips (timestamp and offset delta) have the same width, and everything else is payload."""
    shape: list[tuple[int, bytes]] = []
    start = pos

    def varint(exact: bool, max_bytes: int) -> int:
        nonlocal pos
        result = shift = 0
        for i in range(max_bytes):
            byte = data[pos + i]
            result |= (byte & 0x7F) << shift
            if exact:
                shape.append((pos + i - start, _EXACT_BYTES[byte]))
            else:
                shape.append((pos + i - start, _CONTINUATION_BYTES if byte >= 0x80 else _FINAL_BYTES))
            if byte < 0x80:
                pos += i + 1
                return (result >> 1) ^ -(result & 1)
            shift += 7
        raise _NotFast

    try:
        size = varint(True, 5)
        record_end = pos + size
        if size < 0 or record_end > end:
            return None
        pos += 1  # attributes
        timestamp_at = pos - start
        varint(False, 10)  # timestamp delta
        timestamp_width = pos - start - timestamp_at
        varint(False, 5)  # offset delta
        key_size = varint(True, 5)
        pos += max(key_size, 0)
        value_size = varint(True, 5)
        pos += max(value_size, 0)
        if pos >= record_end:
            return None
        header_count = varint(True, 5)
        if header_count < 0 or header_count > record_end - pos:
            return None
        for _ in range(header_count):
            header_key_size = varint(True, 5)
            if header_key_size < 0:
                return None
            pos += header_key_size
            header_value_size = varint(True, 5)
            pos += max(header_value_size, 0)
            if pos > record_end:
                return None
    except (_NotFast, IndexError):
        return None
    if pos != record_end:
        return None
    return _Template(record_end - start, shape, key_size < 0, timestamp_at, timestamp_width)


@dataclass(frozen=True)
class _Run:
    count: int  # records
    period: int  # bytes of each
    keyless: bool
    min_timestamp_delta: int
    max_timestamp_delta: int


_NO_RUN = _Run(0, 0, False, 0, 0)


def _uniform_run(data: bytes | bytearray, pos: int, end: int, limit: int) -> _Run:
    """The run of same-shaped records starting at `pos`, at most `limit`; a run of 0 records if the
    record at `pos` is not one the fast walk accepts.

    Each constrained byte position is checked for the whole run at once: a strided slice picks that byte
    out of every record and lstrip counts how many leading records have an allowed value there. The
    timestamp deltas of the run's records sit at one position of each: one-byte deltas are ranked
    through a table and their extremes taken in C; wider ones are decoded one by one."""
    template = _record_template(data, pos, end)
    if template is None:
        return _NO_RUN
    period = template.size
    count = min(limit, (end - pos) // period)
    for relative, allowed in template.shape:
        if count <= 1:
            break
        first = pos + relative
        column = data[first : first + (count - 1) * period + 1 : period]
        count = min(count, len(column) - len(column.lstrip(allowed)))
    first = pos + template.timestamp_at
    last = first + (count - 1) * period + 1
    if template.timestamp_width == 1:
        low, high = _byte_extremes(data[first:last:period].translate(_ONE_BYTE_RANK))
        low, high = low - 64, high - 64
    elif template.timestamp_width == 2:
        pairs = bytearray(2 * count)  # each delta's two bytes as one native uint16, first | second << 8
        little = sys.byteorder == "little"
        pairs[0 if little else 1 :: 2] = data[first:last:period]
        pairs[1 if little else 0 :: 2] = data[first + 1 : last + 1 : period]
        deltas = list(map(_two_byte_values().__getitem__, memoryview(pairs).cast("H")))
        low, high = min(deltas), max(deltas)
    else:
        deltas = [_varint_value(data, at, 10)[0] for at in range(first, last, period)]
        low, high = min(deltas), max(deltas)
    return _Run(count, period, template.keyless, low, high)


def _skip_headers(data: bytes | bytearray, pos: int, record_end: int) -> int:
    """Position after a record's headers (count, then per header key size, key, value size, value), or
    -1 when they are malformed; _NotFast for an overlong varint."""
    if pos >= record_end:
        return -1  # the header count must still follow
    header_count, pos = _varint_value(data, pos)
    if header_count < 0 or header_count > record_end - pos:
        return -1
    for _ in range(header_count):
        header_key_size, pos = _varint_value(data, pos)
        if header_key_size < 0:
            return -1
        header_value_size, pos = _varint_value(data, pos + header_key_size)
        if header_value_size > 0:
            pos += header_value_size
        if pos > record_end:
            return -1
    return pos


def _scan_fast(data: bytes | bytearray, count: int, start: int = 0) -> tuple[list[int], int, int] | None:
    """The produce hot path: walk the `count` records in data[start:] without building them and return
    (the indexes of the keyless ones, the smallest and the largest timestamp delta), or None when
    anything is unusual (malformed, overlong varint, bytes left over), in which case the full decoder
    must run and raise Kafka's exact error.

    It accepts exactly the records _decode_record_bytes accepts: the same fields in the same order, the
    record and the batch ending exactly where declared (a read past its record's end always leaves the
    position past that end, since every field read advances it). One- and two-byte varints, nearly all
    of them, are decoded inline.

    Batches of same-sized records (fixed-size values: common, and what benchmarks send) are checked a run
    at a time: now and then (see _FIRST_RUN_TRY) _uniform_run takes the next record as a template and
    checks, column by column in C (strided slices), how many following records have exactly its shape;
    those are valid for the same reason the template is. Runs that do not pay back off exponentially, so
    batches of varied sizes cost little more than the per-record walk."""
    keyless: list[int] = []
    end = len(data)
    pos = start
    index = 0
    next_try = _FIRST_RUN_TRY
    backoff = _RUN_BACKOFF
    low, high = INT64_MAX, INT64_MIN  # timestamp deltas (varlongs)
    try:
        while index < count:
            tried = False
            for current in range(index, count):
                # Zigzag varints: a one-byte varint is negative iff its low bit is set, else its value is
                # byte >> 1; for two bytes the same holds for raw = low 7 bits | second byte << 7.
                # length (varint), then the record attributes (one byte, unused)
                byte = data[pos]
                if byte < 0x80:
                    if byte & 1:
                        return None
                    record_end = pos + 1 + (byte >> 1)
                    pos += 2
                elif data[pos + 1] < 0x80:
                    raw = (byte & 0x7F) | (data[pos + 1] << 7)
                    if raw & 1:
                        return None
                    record_end = pos + 2 + (raw >> 1)
                    pos += 3
                else:
                    size, pos = _varint_value(data, pos)
                    if size < 0:
                        return None
                    record_end = pos + size
                    pos += 1
                if record_end > end:
                    return None
                # timestamp delta (varlong): its extremes are what the timestamp checks need
                byte = data[pos]
                if byte < 0x80:
                    delta = _ONE_BYTE_VALUE[byte]
                    pos += 1
                elif data[pos + 1] < 0x80:
                    raw = (byte & 0x7F) | (data[pos + 1] << 7)
                    delta = (raw >> 1) ^ -(raw & 1)
                    pos += 2
                else:
                    delta, pos = _varint_value(data, pos, 10)
                if delta < low:
                    low = delta
                if delta > high:
                    high = delta
                # offset delta (varint): only skipped; past 8191 it takes three bytes
                if data[pos] < 0x80:
                    pos += 1
                elif data[pos + 1] < 0x80:
                    pos += 2
                elif data[pos + 2] < 0x80:
                    pos += 3
                else:
                    pos = _varint_end(data, pos, 5)
                # key length and key (a negative length is a null key)
                byte = data[pos]
                if byte < 0x80:
                    if byte & 1:
                        keyless.append(current)
                        pos += 1
                    else:
                        pos += 1 + (byte >> 1)
                else:
                    length, pos = _varint_value(data, pos)
                    if length < 0:
                        keyless.append(current)
                    else:
                        pos += length
                # value length and value (a negative length is a null value)
                byte = data[pos]
                if byte < 0x80:
                    pos += 1 if byte & 1 else 1 + (byte >> 1)
                elif data[pos + 1] < 0x80:
                    raw = (byte & 0x7F) | (data[pos + 1] << 7)
                    pos += 2 if raw & 1 else 2 + (raw >> 1)
                else:
                    length, pos = _varint_value(data, pos)
                    if length > 0:
                        pos += length
                # headers: none, the common case, is one zero byte that ends the record
                if (pos + 1 != record_end or data[pos] != 0) and _skip_headers(
                    data, pos, record_end
                ) != record_end:
                    return None
                pos = record_end
                if current != next_try:
                    continue
                tried = True
                break
            if not tried:
                break  # every record walked
            index = current + 1
            run = _uniform_run(data, pos, end, count - index)
            if run.count:
                if run.keyless:
                    keyless.extend(range(index, index + run.count))
                low = min(low, run.min_timestamp_delta)
                high = max(high, run.max_timestamp_delta)
            index += run.count
            pos += run.count * run.period
            if run.count >= _MIN_RUN:
                next_try = index + _RUN_INTERVAL
            else:
                next_try = index + backoff
                backoff *= 2
    except (_NotFast, IndexError):
        return None
    return (keyless, low, high) if pos == end else None


@dataclass(frozen=True)
class RecordScan:
    """What the produce path needs of a batch's records: which have no key, and the smallest and the
    largest of their timestamps as Kafka reads them (``Record.timestamp()``: base timestamp plus delta,
    as a Java long; every record's is maxTimestamp in a LogAppendTime batch)."""

    keyless: list[int]
    min_timestamp: int
    max_timestamp: int


def _as_long(value: int) -> int:
    """``value`` wrapped to a signed 64-bit integer, as Java's long arithmetic does."""
    return (value - INT64_MIN) % 2**64 + INT64_MIN


def scan_records(batch: Buffer, header: BatchHeader) -> RecordScan:
    """Validate every record of one whole batch as decode_records does (same errors) and return what the
    produce path needs of them; cheap for well-formed batches, which are not decoded into Records.

    An uncompressed batch given as exactly its own bytes is walked where it is; otherwise the records
    are copied out (and decompressed) first. Whatever the fast walk does not accept goes to the full
    decoder, which raises Kafka's error for it."""
    in_place = isinstance(batch, bytes | bytearray) and len(batch) == header.size and not header.compression
    fast = None
    if in_place and header.record_count >= 0:
        fast = _scan_fast(cast(bytes | bytearray, batch), header.record_count, HEADER_SIZE)
    if fast is None:
        blob = bytes(memoryview(batch)[HEADER_SIZE : header.size])
        if header.compression:
            blob = _decompress(header, blob)
        if header.record_count >= 0 and not in_place:
            fast = _scan_fast(blob, header.record_count)
        if fast is None:
            records = _decode_record_bytes(header, blob)
            keyless = [index for index, record in enumerate(records) if record.key is None]
            deltas = [record.timestamp - header.base_timestamp for record in records] or [0]
            fast = keyless, min(deltas), max(deltas)
    keyless, low, high = fast
    if header.timestamp_type == LOG_APPEND_TIME:
        return RecordScan(keyless, header.max_timestamp, header.max_timestamp)
    if header.record_count <= 0:
        return RecordScan(keyless, NO_TIMESTAMP, NO_TIMESTAMP)
    base = header.base_timestamp
    if base + low >= INT64_MIN and base + high <= INT64_MAX:
        return RecordScan(keyless, base + low, base + high)
    # A sum past a long wraps in Kafka: the extremes are those of the wrapped timestamps.
    records = decode_records(batch)
    wrapped = [_as_long(base + (record.timestamp - base)) for record in records]
    return RecordScan(keyless, min(wrapped), max(wrapped))


def decode_records(batch: Buffer) -> list[Record]:
    """Decode every record of one batch (any codec). Does not check the CRC: see crc_is_valid.

    Raises CorruptBatchError for a bad header or undecompressable blob, InvalidRecordError for malformed
    records, CodecUnavailableError when the codec's Python library is missing.
    """
    header = parse_header(batch)
    if len(batch) < header.size:
        raise CorruptBatchError(
            f"batch at offset {header.base_offset} is truncated: {len(batch)} of {header.size} bytes",
            incomplete_size=header.size,
        )
    blob = bytes(memoryview(batch)[HEADER_SIZE : header.size])
    if header.compression:
        blob = _decompress(header, blob)
    return _decode_record_bytes(header, blob)


def control_marker(batch: Buffer) -> tuple[str, int] | None:
    """("COMMIT" | "ABORT", coordinator_epoch) for a transaction marker batch, else None."""
    header = parse_header(batch)
    if not header.is_control:
        return None
    records = decode_records(batch)
    if not records:
        return None  # an emptied control batch kept only for its producer epoch
    key, value = records[0].key, records[0].value
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptBatchError(
            f"control batch at offset {header.base_offset} has a {0 if key is None else len(key)}-byte key; "
            f"a control record key needs at least {_CONTROL_KEY.size} bytes"
        )
    key_version, control_type = _CONTROL_KEY.unpack_from(key)
    if key_version < 0:
        raise CorruptBatchError(f"control batch at offset {header.base_offset} has key version {key_version}")
    if control_type not in (0, 1):
        return None
    if value is None or len(value) < _END_TXN_VALUE.size:
        raise CorruptBatchError(
            f"transaction marker at offset {header.base_offset} has a "
            f"{0 if value is None else len(value)}-byte value; it needs at least {_END_TXN_VALUE.size} bytes"
        )
    value_version, coordinator_epoch = _END_TXN_VALUE.unpack_from(value)
    if value_version < 0:
        raise CorruptBatchError(
            f"transaction marker at offset {header.base_offset} has value version {value_version}"
        )
    return _CONTROL_TYPE_NAMES[control_type], coordinator_epoch


# ---------------------------------------------------------------------------------------------------
# encoding


def _encode_record(record: Record, offset_delta: int, timestamp_delta: int) -> bytes:
    body = bytearray(b"\x00")  # record attributes, unused in v2
    _write_varint(timestamp_delta, body)
    _write_varint(offset_delta, body)
    for field in (record.key, record.value):
        if field is None:
            _write_varint(-1, body)
        else:
            _write_varint(len(field), body)
            body += field
    _write_varint(len(record.headers), body)
    for header_key, header_value in record.headers:
        encoded_key = header_key.encode("utf-8", "surrogateescape")
        _write_varint(len(encoded_key), body)
        body += encoded_key
        if header_value is None:
            _write_varint(-1, body)
        else:
            _write_varint(len(header_value), body)
            body += header_value
    out = bytearray()
    _write_varint(len(body), out)
    return bytes(out + body)


def _assemble_batch(
    records_blob: bytes,
    *,
    base_offset: int,
    partition_leader_epoch: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
) -> bytes:
    batch = bytearray(HEADER_SIZE + len(records_blob))
    _HEADER.pack_into(
        batch,
        0,
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(records_blob),
        partition_leader_epoch,
        MAGIC,
        0,  # crc, filled in below once the covered bytes are final
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
    batch[HEADER_SIZE:] = records_blob
    _UINT32.pack_into(batch, _CRC_OFFSET, crc32c.crc32c(memoryview(batch)[_ATTRIBUTES_OFFSET:]))
    return bytes(batch)


def encode_batch(
    records: Sequence[Record],
    *,
    base_offset: int,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    timestamp_type: int = CREATE_TIME,
    partition_leader_epoch: int = 0,
    last_offset_delta: int | None = None,
    max_timestamp: int | None = None,
    delete_horizon_ms: int | None = None,
    compression: int = 0,
    is_control: bool = False,
) -> bytes:
    """Encode a v2 batch; records keep their absolute offsets (gaps allowed, as after compaction).

    `last_offset_delta` defaults to the last record's delta; compaction passes the original batch's so the
    producer's last sequence survives (Kafka's overrideLastOffset). With no records it is required and an
    empty batch header is written (baseTimestamp -1, as Kafka's writeEmptyHeader). `max_timestamp` defaults to
    the records' maximum. `delete_horizon_ms` sets the delete-horizon flag and stores the horizon in
    baseTimestamp, with record timestamp deltas relative to it (KIP-534). `compression` is a codec id
    (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd); compaction keeps each batch's codec, as Kafka's cleaner does.
    """
    if not 0 <= compression < len(COMPRESSION_NAMES):
        raise ValueError(f"compression must be a codec id 0-4 (none/gzip/snappy/lz4/zstd): {compression}")
    if timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
        raise ValueError(f"timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime), got {timestamp_type}")
    if is_transactional and producer_id < 0:
        raise ValueError("a transactional batch needs a producer id >= 0")
    previous = base_offset - 1
    for record in records:
        if record.offset <= previous:
            raise ValueError(
                f"record offsets must be increasing and >= base_offset {base_offset}; got {record.offset} "
                f"after {previous}"
            )
        previous = record.offset
    if last_offset_delta is None:
        if not records:
            raise ValueError("an empty batch needs last_offset_delta (the original batch's offset range)")
        last_offset_delta = records[-1].offset - base_offset
    elif last_offset_delta < previous - base_offset:
        raise ValueError(
            f"last_offset_delta {last_offset_delta} ends before the last record offset {previous}"
        )
    if last_offset_delta > INT32_MAX:
        raise ValueError(f"a batch spans at most 2**31 offsets; last_offset_delta is {last_offset_delta}")

    if delete_horizon_ms is not None:
        base_timestamp = delete_horizon_ms
    else:
        base_timestamp = records[0].timestamp if records else NO_TIMESTAMP
    if max_timestamp is None:
        max_timestamp = max((record.timestamp for record in records), default=NO_TIMESTAMP)
    attributes = (TIMESTAMP_TYPE_FLAG if timestamp_type == LOG_APPEND_TIME else 0) | (
        TRANSACTIONAL_FLAG if is_transactional else 0
    )
    if records:  # Kafka never compresses an empty batch header
        attributes |= compression
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG
    if is_control:  # a transaction marker, rewritten by compaction (its delete horizon)
        attributes |= CONTROL_FLAG
    blob = b"".join(
        _encode_record(record, record.offset - base_offset, record.timestamp - base_timestamp)
        for record in records
    )
    if records and compression:
        blob = _compress(compression, blob)
    return _assemble_batch(
        blob,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=attributes,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        record_count=len(records),
    )


def build_control_batch(
    *,
    offset: int,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
    partition_leader_epoch: int = 0,
) -> bytes:
    """A COMMIT/ABORT marker batch as Kafka's MemoryRecords.withEndTransactionMarker writes it.

    One control record (key: version 0 + type, value: version 0 + coordinator epoch), CreateTime,
    uncompressed, attributes transactional|control, baseSequence -1.
    """
    key = _CONTROL_KEY.pack(0, 1 if commit else 0)
    value = _END_TXN_VALUE.pack(0, coordinator_epoch)
    blob = _encode_record(Record(offset, timestamp_ms, key, value), 0, 0)
    return _assemble_batch(
        blob,
        base_offset=offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG,
        last_offset_delta=0,
        base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        record_count=1,
    )


# ---------------------------------------------------------------------------------------------------
# kafka-dump-log.sh output


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")  # Kafka's StringDecoder also replaces malformed UTF-8


def _control_description(record: Record) -> str:
    key = record.key or b""
    control_type = _CONTROL_KEY.unpack_from(key)[1] if len(key) >= _CONTROL_KEY.size else -1
    if control_type in (0, 1) and record.value is not None and len(record.value) >= _END_TXN_VALUE.size:
        coordinator_epoch = _END_TXN_VALUE.unpack_from(record.value)[1]
        return f" endTxnMarker: {_CONTROL_TYPE_NAMES[control_type]} coordinatorEpoch: {coordinator_epoch}"
    return f" controlType: {_CONTROL_TYPE_NAMES.get(control_type, 'UNKNOWN')}({control_type})"


def format_batch_dump(
    header: BatchHeader,
    batch: Buffer,
    *,
    position: int,
    print_records: bool = True,
    print_payload: bool = True,
) -> list[str]:
    """Lines kafka-dump-log.sh prints for one batch (Kafka's DumpLogSegments.dumpLog/printBatchLevel).

    `position` is the batch's byte position in its segment file. `print_records` adds a line per record
    (--deep-iteration); `print_payload` then also prints keys and values (--print-data-log).
    """
    timestamp_name = "LogAppendTime" if header.timestamp_type == LOG_APPEND_TIME else "CreateTime"
    horizon = header.delete_horizon_ms
    codec = COMPRESSION_NAMES[header.compression] if header.compression < len(COMPRESSION_NAMES) else "?"
    is_valid = crc_is_valid(batch, header)
    lines = [
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} count: {header.record_count} "
        f"baseSequence: {header.base_sequence} lastSequence: {header.last_sequence} "
        f"producerId: {header.producer_id} producerEpoch: {header.producer_epoch} "
        f"partitionLeaderEpoch: {header.partition_leader_epoch} "
        f"isTransactional: {str(header.is_transactional).lower()} "
        f"isControl: {str(header.is_control).lower()} "
        f"deleteHorizonMs: {'OptionalLong.empty' if horizon is None else f'OptionalLong[{horizon}]'} "
        f"position: {position} {timestamp_name}: {header.max_timestamp} size: {header.size} "
        f"magic: {header.magic} compresscodec: {codec} crc: {header.crc} isvalid: {str(is_valid).lower()}"
    ]
    if not print_records:
        return lines
    try:
        records = decode_records(batch)
    except (CorruptBatchError, InvalidRecordError, CodecUnavailableError) as exc:
        return [*lines, f"| cannot decode records: {exc}"]
    for record in records:
        sequence = (
            increment_sequence(header.base_sequence, record.offset - header.base_offset)
            if header.base_sequence >= 0
            else NO_SEQUENCE
        )
        header_keys = ",".join(_text(key.encode("utf-8", "surrogateescape")) for key, _ in record.headers)
        line = (
            f"| offset: {record.offset} {timestamp_name}: {record.timestamp} "
            f"keySize: {-1 if record.key is None else len(record.key)} "
            f"valueSize: {-1 if record.value is None else len(record.value)} "
            f"sequence: {sequence} headerKeys: [{header_keys}]"
        )
        if header.is_control:
            line += _control_description(record)
        elif print_payload:
            if record.key is not None:
                line += f" key: {_text(record.key)}"
            if record.value is not None:
                line += f" payload: {_text(record.value)}"
        lines.append(line)
    return lines
